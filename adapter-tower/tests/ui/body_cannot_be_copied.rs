// A body the retry layer cannot copy (axum's `Body`, a type of another crate): the error names
// `ReplayBody`, and where a service is required (a server, a `BoxCloneService`), how to fix it.
use std::time::Duration;

use axum_core::body::Body;
use http::{Request, Response};
use persevere_tower::{Backoff, RetryLayer, RetryPolicy};
use tower::{Service, ServiceBuilder, ServiceExt, service_fn};

async fn send(request: Request<Body>) -> Result<Response<String>, std::io::Error> {
    let _ = request;
    Ok(Response::new(String::new()))
}

fn served<S: Service<Request<Body>>>(_: &S) {}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let policy = RetryPolicy::builder(Backoff::constant(Duration::from_millis(10)).build().unwrap())
        .max_attempts(3)
        .build()
        .unwrap();
    let client = ServiceBuilder::new().layer(RetryLayer::new(policy)).service(service_fn(send));
    served(&client);
    let request = Request::post("http://example.com/").body(Body::from("order")).unwrap();
    let _ = client.oneshot(request).await;
}
