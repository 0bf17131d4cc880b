//! Drawing the view with ratatui: a title line, the rows as a table, the key help.

use super::rows::{cells, Row, State, HEADER};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Cell, Paragraph, Table};
use ratatui::Frame;

/// Draws `rows` with a title naming how many nodes answered of how many asked, and the
/// window the rates cover.
pub fn draw(frame: &mut Frame<'_>, rows: &[Row], title: &str) {
    let [top, middle, bottom] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(1),
        Constraint::Length(1),
    ])
    .areas(frame.area());
    frame.render_widget(
        Paragraph::new(Line::from(title.to_owned()))
            .style(Style::new().add_modifier(Modifier::BOLD)),
        top,
    );
    let header = ratatui::widgets::Row::new(HEADER.map(Cell::from))
        .style(Style::new().add_modifier(Modifier::REVERSED));
    let body = rows.iter().map(|row| {
        let style = match row.state {
            State::Unreachable(_) | State::Down(_) => Style::new().fg(Color::Red),
            State::Blocked => Style::new().fg(Color::Yellow),
            State::Up => Style::new(),
        };
        ratatui::widgets::Row::new(cells(row).map(Cell::from)).style(style)
    });
    let widths = [
        Constraint::Min(12),
        Constraint::Min(16),
        Constraint::Length(11),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(8),
        Constraint::Length(6),
        Constraint::Length(8),
        Constraint::Min(12),
    ];
    frame.render_widget(
        Table::new(body, widths).header(header).column_spacing(2),
        middle,
    );
    frame.render_widget(
        Paragraph::new(
            "q: quit   rows: worst first (unreachable, down, blocked, then the oldest backlog)",
        ),
        bottom,
    );
}
