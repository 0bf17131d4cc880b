//! The web console: one page and its script and style sheet, embedded in the binary and
//! served by the admin listener at `/` and under `/console/`. The page holds no data and
//! loads without a token; its script calls `/api/v1` with the token the user signs in with.

use actix_web::http::header;
use actix_web::{web, HttpResponse};

/// The page, its script and its style sheet.
const INDEX: &str = include_str!("console/index.html");
const SCRIPT: &str = include_str!("console/app.js");
const STYLE: &str = include_str!("console/app.css");

/// The console's own policy, in place of the API's `default-src 'none'`: script, style
/// and calls from the relay's origin only, nothing inline (the page carries no inline
/// script or style), no framing, no `<base>`, no form submitted anywhere.
pub(super) const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self'; frame-ancestors 'none'; base-uri 'none'; \
     form-action 'none'";

/// The console's routes, for the server's `App`.
pub(super) fn configure(config: &mut web::ServiceConfig) {
    config
        .route("/", web::get().to(|| async { asset(INDEX, "text/html") }))
        .route(
            "/console/app.js",
            web::get().to(|| async { asset(SCRIPT, "text/javascript") }),
        )
        .route(
            "/console/app.css",
            web::get().to(|| async { asset(STYLE, "text/css") }),
        );
}

/// One embedded file with the console's policy; the other security headers (`no-store`,
/// `nosniff`) are the server's defaults for every response.
fn asset(body: &'static str, media_type: &str) -> HttpResponse {
    HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, format!("{media_type}; charset=utf-8")))
        .insert_header((header::CONTENT_SECURITY_POLICY, POLICY))
        .body(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_its_script_and_style_from_the_relay_and_has_nothing_inline() {
        assert!(INDEX.contains(r#"<script src="/console/app.js""#));
        assert!(INDEX.contains(r#"<link rel="stylesheet" href="/console/app.css">"#));
        assert!(INDEX.contains(r#"<meta name="viewport""#));
        // Nothing the policy would block: no inline script, handler or style, no other origin.
        for blocked in [
            "<script>",
            " onclick=",
            " onload=",
            "<style",
            " style=",
            "http://",
            "https://",
        ] {
            assert!(!INDEX.contains(blocked), "{blocked}");
        }
        assert!(
            !SCRIPT.contains("innerHTML"),
            "data is set with textContent only"
        );
    }
}
