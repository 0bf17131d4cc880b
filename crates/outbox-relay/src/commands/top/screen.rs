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
            State::Unreachable(_) | State::Down(_) | State::Stalled(_) => {
                Style::new().fg(Color::Red)
            }
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
            "q: quit   rows: worst first (unreachable, down, stalled, blocked, then the oldest backlog)",
        ),
        bottom,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    fn row(node: &str, state: State) -> Row {
        Row {
            outbox: "orders".into(),
            node: node.into(),
            published_per_s: Some(812.5),
            failed_per_s: Some(0.0),
            backlog: Some(42.0),
            oldest_age: Some(3.5),
            dead: Some(1.0),
            p99: Some(0.018),
            state,
        }
    }

    #[test]
    fn the_screen_shows_the_title_the_header_each_row_and_the_keys() {
        let mut terminal = Terminal::new(TestBackend::new(140, 6)).expect("a test terminal");
        let rows = [row("relay-2", State::Blocked), row("relay-1", State::Up)];
        terminal
            .draw(|frame| draw(frame, &rows, "outbox-relay top: 2 of 2 node(s) answering"))
            .expect("drawn");
        let buffer = terminal.backend().buffer();
        let lines: Vec<String> = (0..buffer.area.height)
            .map(|y| {
                (0..buffer.area.width)
                    .map(|x| buffer[(x, y)].symbol())
                    .collect::<String>()
            })
            .collect();
        let screen = lines.join("\n");
        assert!(lines[0].starts_with("outbox-relay top: 2 of 2"), "{screen}");
        for title in HEADER {
            assert!(lines[1].contains(title), "{title}:\n{screen}");
        }
        let cells: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(
            cells,
            ["orders", "relay-2", "812.5", "0.0", "42", "3.5s", "1", "18ms", "blocked"],
            "{screen}"
        );
        assert_eq!(buffer[(0, 2)].fg, Color::Yellow, "a blocked node in yellow");
        assert!(
            lines[3].contains("relay-1") && lines[3].trim_end().ends_with("up"),
            "{screen}"
        );
        assert!(lines[5].starts_with("q: quit"), "{screen}");
    }
}
