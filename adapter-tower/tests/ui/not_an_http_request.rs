// Requests that are not HTTP requests, through a retry layer that chose no classifier: where a
// service is required, the error names the classifier's traits and the fix (choose one by name).
use std::time::Duration;

use persevere_tower::{Backoff, RetryLayer, RetryPolicy};
use tower::{Service, ServiceBuilder, service_fn};

async fn lookup(key: u32) -> Result<String, std::io::Error> {
    Ok(key.to_string())
}

fn served<S: Service<u32>>(_: &S) {}

fn main() {
    let policy = RetryPolicy::builder(Backoff::constant(Duration::from_millis(10)).build().unwrap())
        .max_attempts(3)
        .build()
        .unwrap();
    let service = ServiceBuilder::new().layer(RetryLayer::new(policy)).service(service_fn(lookup));
    served(&service);
}
