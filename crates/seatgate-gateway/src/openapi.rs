//! The OpenAPI 3.1 document of the API, generated from the handlers and
//! their types (utoipa). `/openapi.json` serves it; docs/openapi.json is
//! the same document committed, and a test checks that they agree
//! (`seatgate gateway openapi > docs/openapi.json` writes it).

use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::api;
use crate::problem::Problem;

/// The document.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "seatgate gateway",
        description = "Floating-license seats over HTTPS: acquire, heartbeat and release a seat, wait for one and follow it over server-sent events, read a license's availability, and verify borrow tokens offline. Who is asking is decided by the bearer credential (a gateway token or an OpenID Connect access token), never by the request. docs/gateway.md describes each call.",
        license(name = "MIT OR Apache-2.0")
    ),
    paths(api::acquire, api::heartbeat, api::release, api::events, api::license, api::jwks),
    components(schemas(api::AcquireBody, api::SeatResponse, api::SessionResponse, api::LicenseResponse, Problem)),
    modifiers(&Bearer),
    tags(
        (name = "seats", description = "A seat and its session"),
        (name = "licenses", description = "Licenses"),
        (name = "borrow", description = "Offline borrowing")
    )
)]
pub struct ApiDoc;

struct Bearer;

impl Modify for Bearer {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        if let Some(components) = openapi.components.as_mut() {
            components.add_security_scheme(
                "bearer",
                SecurityScheme::Http(
                    Http::builder()
                        .scheme(HttpAuthScheme::Bearer)
                        .description(Some("A gateway token (`sgt_…`, `seatgate token issue`) or a JWT access token of the configured OpenID Connect issuer"))
                        .build(),
                ),
            );
        }
    }
}

/// The document as pretty JSON with a final newline: what `/openapi.json`
/// serves and docs/openapi.json holds.
pub fn document() -> String {
    let mut json = ApiDoc::openapi()
        .to_pretty_json()
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    json.push('\n');
    json
}
