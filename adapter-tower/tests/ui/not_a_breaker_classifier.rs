// A breaker layer given a retry classifier: the error says what a breaker classifier is.
use std::time::Duration;

use http::{Request, Response};
use persevere_tower::{Backoff, Breaker, BreakerLayer, BreakerPolicy, Http};
use tower::{Service, ServiceBuilder, service_fn};

async fn send(request: Request<String>) -> Result<Response<String>, std::io::Error> {
    Ok(Response::new(request.into_body()))
}

fn served<S: Service<Request<String>>>(_: &S) {}

fn main() {
    let open_for = Backoff::constant(Duration::from_secs(5)).build().unwrap();
    let breaker = Breaker::new(BreakerPolicy::builder(open_for).consecutive_failures(5).build().unwrap());
    let service = ServiceBuilder::new().layer(BreakerLayer::new(breaker).classify(Http::new())).service(service_fn(send));
    served(&service);
}
