//! `outbox-relay top [--once] [URL…]`: the relay's figures from one or more nodes'
//! `/metrics`, one row per outbox and node, refreshed every second (docs/metrics.md#watching-it-live-outbox-relay-top,
//! "Watching it live").
//!
//! - [`scrape`]: fetching and reading one node's `/metrics`.
//! - [`rows`]: rates and p99 between two looks, worst rows first, the plain table.
//! - [`screen`]: drawing them with ratatui.

mod rows;
mod scrape;
mod screen;

use crate::cli::TopArgs;
use crate::settings::Config;
use crate::startup::ConfigProblem;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use scrape::{Look, Target};
use std::collections::VecDeque;
use std::io::IsTerminal as _;
use std::time::Duration;
use tokio::time::Instant;

/// How often the view looks at every node.
const REFRESH: Duration = Duration::from_secs(1);
/// Rates and the p99 cover the looks of this long, at most (one second is noisy).
const WINDOW: Duration = Duration::from_secs(10);
/// Keys are read this often between refreshes.
const KEY_POLL: Duration = Duration::from_millis(50);

/// Runs `top`: the live view, or with `--once` one plain table (two looks a second apart,
/// so the rates are real; an error, exit code 1, when no node answered).
pub async fn top(config: Config, args: TopArgs) -> anyhow::Result<()> {
    let targets = targets(&config, &args.urls)?;
    let mut history: Vec<VecDeque<Look>> = vec![VecDeque::new(); targets.len()];
    if args.once {
        look_at_all(&targets, &mut history).await;
        tokio::time::sleep(REFRESH).await;
        look_at_all(&targets, &mut history).await;
        say!(
            "{}",
            rows::plain_table(&current_rows(&targets, &history)).trim_end()
        )?;
        let answered = history
            .iter()
            .filter(|looks| looks.back().is_some_and(|look| look.figures.is_ok()))
            .count();
        if answered == 0 {
            anyhow::bail!("no node answered ({} asked)", targets.len());
        }
        return Ok(());
    }
    if !std::io::stdout().is_terminal() {
        return Err(ConfigProblem(
            "top draws on a terminal and standard output is not one; use `top --once` for a \
             plain table"
                .into(),
        )
        .into());
    }
    let mut terminal = ratatui::try_init()?;
    let outcome = live(&mut terminal, &targets, &mut history).await;
    ratatui::try_restore()?;
    outcome
}

/// The targets: the URLs given, else the local `metrics.listen`.
fn targets(config: &Config, urls: &[String]) -> anyhow::Result<Vec<Target>> {
    if urls.is_empty() {
        let Some(mut listen) = config.metrics_listen else {
            return Err(ConfigProblem(
                "metrics.listen is empty, so there is no local /metrics to read; give the \
                 nodes' URLs, such as `outbox-relay top http://relay-1:9187`"
                    .into(),
            )
            .into());
        };
        // A node listening on every address is reached on loopback.
        if listen.ip().is_unspecified() {
            listen.set_ip(match listen {
                std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        return Ok(vec![Target::parse(&format!("http://{listen}/metrics"))?]);
    }
    urls.iter()
        .map(|url| Target::parse(url).map_err(|error| ConfigProblem(format!("{error:#}")).into()))
        .collect()
}

/// Looks at every target once, at the same time, keeping each one's looks of the window.
async fn look_at_all(targets: &[Target], history: &mut [VecDeque<Look>]) {
    let handles: Vec<_> = targets
        .iter()
        .map(|target| {
            let target = target.clone();
            actix_rt::spawn(async move { scrape::look(&target).await })
        })
        .collect();
    for (handle, looks) in handles.into_iter().zip(history.iter_mut()) {
        let look = handle.await.unwrap_or_else(|error| Look {
            at: Instant::now(),
            figures: Err(error.to_string()),
        });
        looks.push_back(look);
        while looks.len() > 2 && looks[1].at.elapsed() >= WINDOW {
            looks.pop_front();
        }
    }
}

fn current_rows(targets: &[Target], history: &[VecDeque<Look>]) -> Vec<rows::Row> {
    let windows: Vec<rows::Window<'_>> = targets
        .iter()
        .zip(history)
        .filter_map(|(target, looks)| {
            Some(rows::Window {
                shown: &target.shown,
                earlier: looks.front().filter(|_| looks.len() > 1),
                latest: looks.back()?,
            })
        })
        .collect();
    rows::rows(&windows)
}

async fn live(
    terminal: &mut ratatui::DefaultTerminal,
    targets: &[Target],
    history: &mut [VecDeque<Look>],
) -> anyhow::Result<()> {
    let mut next = Instant::now();
    loop {
        if Instant::now() >= next {
            look_at_all(targets, history).await;
            let shown = current_rows(targets, history);
            next += REFRESH;
            let answered = history
                .iter()
                .filter(|looks| looks.back().is_some_and(|look| look.figures.is_ok()))
                .count();
            let span = history
                .iter()
                .filter_map(|looks| Some(looks.back()?.at.duration_since(looks.front()?.at)))
                .max()
                .unwrap_or_default();
            let title = format!(
                "outbox-relay top: {answered} of {} node(s) answering; rates over the last {:.0} s",
                targets.len(),
                span.as_secs_f64()
            );
            terminal.draw(|frame| screen::draw(frame, &shown, &title))?;
        }
        while event::poll(Duration::ZERO)? {
            match event::read()? {
                Event::Key(key) if key.kind == KeyEventKind::Press => {
                    let ctrl_c = key.code == KeyCode::Char('c')
                        && key.modifiers.contains(KeyModifiers::CONTROL);
                    if matches!(key.code, KeyCode::Char('q') | KeyCode::Esc) || ctrl_c {
                        return Ok(());
                    }
                }
                // Redrawn at the next refresh, at the new size.
                _ => {}
            }
        }
        tokio::time::sleep(KEY_POLL).await;
    }
}
