//! The HTTP endpoint for load balancers, orchestrators and Prometheus:
//! `GET /healthz` (alive), `GET /readyz` (should get traffic) and
//! `GET /metrics`. Plain HTTP/1.1 on its own listener; keep it off the
//! public network.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::Health;
use super::metrics::render;

/// What the endpoint answers from.
pub struct Endpoint {
    pub health: Arc<Health>,
    pub registry: Registry,
}

/// The content type of the OpenMetrics text `render` writes (Prometheus
/// negotiates it).
const METRICS_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves until `cancel`.
pub async fn serve(listener: TcpListener, endpoint: Arc<Endpoint>, cancel: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            () = cancel.cancelled() => return,
            a = listener.accept() => a,
        };
        let Ok((stream, _)) = accepted else { continue };
        let endpoint = endpoint.clone();
        let cancel = cancel.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let answer = endpoint.answer(&req);
                async move { Ok::<_, Infallible>(answer) }
            });
            let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                () = cancel.cancelled() => {}
                _ = conn => {}
            }
        });
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r
}

impl Endpoint {
    fn answer(&self, req: &Request<Incoming>) -> Response<Full<Bytes>> {
        if !matches!(*req.method(), Method::GET | Method::HEAD) {
            return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into());
        }
        match req.uri().path() {
            "/healthz" => match self.health.alive() {
                Ok(()) => text(StatusCode::OK, "ok\n".into()),
                Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
            },
            "/readyz" => match self.health.ready() {
                Ok(()) => text(StatusCode::OK, "ready\n".into()),
                Err(why) => text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("{}\n", why.join("\n")),
                ),
            },
            "/metrics" => self.metrics(),
            other => text(
                StatusCode::NOT_FOUND,
                format!("no {other}: try /healthz, /readyz, /metrics\n"),
            ),
        }
    }

    fn metrics(&self) -> Response<Full<Bytes>> {
        match render(&self.registry) {
            Ok(body) => {
                let mut r = text(StatusCode::OK, body);
                if let Ok(v) = METRICS_TYPE.parse() {
                    r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
                }
                r
            }
            Err(_) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "metrics could not be rendered\n".into(),
            ),
        }
    }
}
