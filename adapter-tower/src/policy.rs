//! How the retry layer holds its policy: shared by every call, without a copy.

use std::borrow::Borrow;
use std::fmt;
use std::sync::Arc;

use persevere::RetryPolicy;

/// The [`RetryPolicy`] of a [`RetryLayer`](crate::RetryLayer), shared by its services and
/// their calls.
///
/// From a `RetryPolicy` (moved behind an `Arc`: each call takes a counted reference, two
/// atomic operations), an `Arc<RetryPolicy>`, or a `&'static RetryPolicy` (each call copies a
/// pointer: the cheapest, for a policy in a `static` or a `LazyLock`).
///
/// ```
/// use std::sync::LazyLock;
/// use std::time::Duration;
/// use persevere::{Backoff, RetryPolicy};
/// use persevere_tower::RetryLayer;
///
/// static POLICY: LazyLock<RetryPolicy> = LazyLock::new(|| {
///     RetryPolicy::builder(Backoff::constant(Duration::from_millis(100)).build().unwrap()).max_attempts(3).build().unwrap()
/// });
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let layer = RetryLayer::new(&*POLICY);
/// # let _ = layer; }
/// ```
#[derive(Clone)]
pub struct SharedPolicy(Holder);

#[derive(Clone)]
enum Holder {
    Static(&'static RetryPolicy),
    Counted(Arc<RetryPolicy>),
}

impl Borrow<RetryPolicy> for SharedPolicy {
    #[inline(always)]
    fn borrow(&self) -> &RetryPolicy {
        match &self.0 {
            Holder::Static(policy) => policy,
            Holder::Counted(policy) => policy,
        }
    }
}

impl fmt::Debug for SharedPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Borrow::<RetryPolicy>::borrow(self).fmt(f)
    }
}

impl From<RetryPolicy> for SharedPolicy {
    fn from(policy: RetryPolicy) -> Self {
        SharedPolicy(Holder::Counted(Arc::new(policy)))
    }
}

impl From<Arc<RetryPolicy>> for SharedPolicy {
    fn from(policy: Arc<RetryPolicy>) -> Self {
        SharedPolicy(Holder::Counted(policy))
    }
}

impl From<&'static RetryPolicy> for SharedPolicy {
    fn from(policy: &'static RetryPolicy) -> Self {
        SharedPolicy(Holder::Static(policy))
    }
}
