//! Request bodies buffered up to a limit so that they can be sent again (H4): axum's `Body`,
//! hyper's `Incoming`, a `StreamBody`, any body.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, Request};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::replay::ReplayBody;

/// Buffers each request body up to `max_bytes`, so that a retry (or hedge) layer under it can
/// send the request again: for bodies that do not implement [`ReplayBody`] and cannot be made
/// to (axum's `Body`, hyper's `Incoming`, a `StreamBody`: types of other crates).
///
/// Each request goes on with a [`Buffered`] body: the whole body, which can be copied, when
/// it ends within `max_bytes`; otherwise what was read, followed by the rest of the stream,
/// which is sent once (the error says
/// [`SentOnce::NotClonable`](crate::SentOnce::NotClonable)). A body whose size hint says it
/// is longer than `max_bytes` is not read first; a body that fails while it is read is sent
/// once too, and fails the same way when sent. Nothing is lost either way: the inner service
/// receives every byte and the trailers.
///
/// It goes outside the retry layer. Bodies must be `Unpin` (box one that is not, with
/// `http_body_util::BodyExt::boxed`).
///
/// ```
/// use std::convert::Infallible;
/// use std::time::Duration;
/// use bytes::Bytes;
/// use http::{Request, Response, StatusCode};
/// use http_body_util::combinators::BoxBody;
/// use http_body_util::{BodyExt, Full};
/// use persevere_tower::{Backoff, BufferBodyLayer, Buffered, RetryLayer, RetryPolicy};
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // A body that cannot be copied as it is (axum's `Body` and hyper's `Incoming` are others).
/// type Streamed = BoxBody<Bytes, Infallible>;
/// let policy = RetryPolicy::builder(Backoff::constant(Duration::from_millis(10)).build()?).max_attempts(3).build()?;
/// let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
/// let client = ServiceBuilder::new()
///     .layer(BufferBodyLayer::new(64 * 1024))
///     .layer(RetryLayer::new(policy))
///     .service(service_fn(move |request: Request<Buffered<Streamed>>| {
///         // hyper-util's client goes here: it sends any body. This one is unavailable once.
///         let first = calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0;
///         async move {
///             let body = request.into_body().collect().await?.to_bytes();
///             let mut response = Response::new(body.len());
///             *response.status_mut() = if first { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK };
///             Ok::<_, Infallible>(response)
///         }
///     }));
/// let upload: Streamed = Full::new(Bytes::from_static(b"twelve bytes")).boxed();
/// let response = client.oneshot(Request::put("http://example.com/upload").body(upload)?).await?;
/// assert_eq!((response.status(), *response.body()), (StatusCode::OK, 12));
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct BufferBodyLayer {
    max_bytes: usize,
}

impl BufferBodyLayer {
    /// Buffers bodies of up to `max_bytes` bytes; longer ones are sent once.
    pub fn new(max_bytes: usize) -> Self {
        BufferBodyLayer { max_bytes }
    }
}

impl<S> Layer<S> for BufferBodyLayer {
    type Service = BufferBody<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BufferBody { inner, max_bytes: self.max_bytes }
    }
}

/// A service whose requests' bodies are buffered: made by [`BufferBodyLayer`].
#[derive(Clone, Debug)]
pub struct BufferBody<S> {
    inner: S,
    max_bytes: usize,
}

impl<S, B> Service<Request<B>> for BufferBody<S>
where
    S: Service<Request<Buffered<B>>> + Clone,
    B: Body + Unpin,
    B::Data: Buf,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BufferFuture<S, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The service that said it is ready is called once the body is read.
        let clone = self.inner.clone();
        let service = std::mem::replace(&mut self.inner, clone);
        let (parts, body) = request.into_parts();
        let reading = Reading { service, parts, body, read: BytesMut::new(), trailers: None };
        let stage = if body_longer_than(&reading.body, self.max_bytes) {
            // Known to be too long: sent once, as it comes.
            Stage::Calling { future: reading.call(Read::Partly) }
        } else {
            Stage::Reading { reading: Some(reading), max_bytes: self.max_bytes }
        };
        BufferFuture { stage }
    }
}

/// Whether `body` says it is longer than `max_bytes`.
fn body_longer_than<B: Body>(body: &B, max_bytes: usize) -> bool {
    body.size_hint().lower() > u64::try_from(max_bytes).unwrap_or(u64::MAX)
}

/// A request whose body is being read.
struct Reading<S, B> {
    service: S,
    parts: http::request::Parts,
    body: B,
    read: BytesMut,
    trailers: Option<HeaderMap>,
}

/// How far a body was read.
enum Read<E> {
    /// To its end.
    Whole,
    /// Past the limit (or not at all): the rest is still in the body.
    Partly,
    /// Until it failed with this error.
    Failed(E),
}

impl<S, B> Reading<S, B>
where
    S: Service<Request<Buffered<B>>>,
    B: Body,
{
    /// Sends the request on with what was read of its body, and the rest of it if any.
    fn call(self, read: Read<B::Error>) -> S::Future {
        let Reading { mut service, parts, body, read: bytes, trailers } = self;
        let bytes = (!bytes.is_empty()).then(|| bytes.freeze());
        let kind = match read {
            Read::Whole => Kind::Whole { data: bytes.unwrap_or_default(), trailers, sent_data: false },
            Read::Partly => Kind::Partial { read: bytes, rest: Some(body) },
            Read::Failed(error) => Kind::Failed { read: bytes, error: Some(error) },
        };
        service.call(Request::from_parts(parts, Buffered { kind }))
    }
}

pin_project! {
    #[project = StageProjection]
    enum Stage<S, B>
    where
        S: Service<Request<Buffered<B>>>,
        B: Body,
    {
        /// Reading the body (`None` while it is handed on).
        Reading { reading: Option<Reading<S, B>>, max_bytes: usize },
        /// The inner service's call.
        Calling { #[pin] future: S::Future },
    }
}

pin_project! {
    /// The future of a call of [`BufferBody`]: reads the body, then calls the inner service.
    #[must_use = "futures do nothing unless awaited"]
    pub struct BufferFuture<S, B>
    where
        S: Service<Request<Buffered<B>>>,
        B: Body,
    {
        #[pin]
        stage: Stage<S, B>,
    }
}

impl<S, B> fmt::Debug for BufferFuture<S, B>
where
    S: Service<Request<Buffered<B>>>,
    B: Body,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferFuture").finish_non_exhaustive()
    }
}

impl<S, B> Future for BufferFuture<S, B>
where
    S: Service<Request<Buffered<B>>>,
    B: Body + Unpin,
    B::Data: Buf,
{
    type Output = Result<S::Response, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let (reading, read) = match this.stage.as_mut().project() {
                StageProjection::Calling { future } => return future.poll(cx),
                StageProjection::Reading { reading, max_bytes } => {
                    let Some(state) = reading.as_mut() else { panic!("`BufferFuture` polled after a panic") };
                    let read = match Pin::new(&mut state.body).poll_frame(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(None) => Read::Whole,
                        Poll::Ready(Some(Err(error))) => Read::Failed(error),
                        Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                            Ok(mut data) => {
                                while data.has_remaining() {
                                    let chunk = data.chunk();
                                    state.read.extend_from_slice(chunk);
                                    let n = chunk.len();
                                    data.advance(n);
                                }
                                if state.read.len() <= *max_bytes {
                                    continue;
                                }
                                Read::Partly
                            }
                            Err(frame) => {
                                if let Ok(trailers) = frame.into_trailers() {
                                    state.trailers.get_or_insert_with(HeaderMap::new).extend(trailers);
                                }
                                continue;
                            }
                        },
                    };
                    let Some(reading) = reading.take() else { unreachable!("checked above") };
                    (reading, read)
                }
            };
            this.stage.set(Stage::Calling { future: reading.call(read) });
        }
    }
}

/// A request body as [`BufferBodyLayer`] passes it on: the whole body, buffered, which
/// [`ReplayBody`] copies for a retry; or, past the limit, what was read and then the rest of
/// the stream, sent once.
pub struct Buffered<B: Body> {
    kind: Kind<B>,
}

enum Kind<B: Body> {
    /// The whole body, within the limit, and its trailers (`sent_data` once its frame is out).
    Whole { data: Bytes, trailers: Option<HeaderMap>, sent_data: bool },
    /// Past the limit: what was read, then the rest of the stream.
    Partial { read: Option<Bytes>, rest: Option<B> },
    /// Reading failed: what was read, then the error.
    Failed { read: Option<Bytes>, error: Option<B::Error> },
}

impl<B: Body> Buffered<B> {
    /// Whether the whole body is buffered, so that it can be sent again.
    pub fn is_whole(&self) -> bool {
        matches!(self.kind, Kind::Whole { .. })
    }
}

impl<B: Body> fmt::Debug for Buffered<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Whole { .. } => "whole",
            Kind::Partial { .. } => "partial",
            Kind::Failed { .. } => "failed",
        };
        f.debug_struct("Buffered").field("kind", &kind).finish_non_exhaustive()
    }
}

/// A body of `B: Unpin` is moved, never pinned in place, so `Buffered` is `Unpin` too, whatever
/// its data and error types.
impl<B: Body + Unpin> Unpin for Buffered<B> {}

impl<B: Body> ReplayBody for Buffered<B> {
    fn try_clone(&self) -> Option<Self> {
        match &self.kind {
            Kind::Whole { data, trailers, .. } => Some(Buffered {
                kind: Kind::Whole { data: data.clone(), trailers: trailers.clone(), sent_data: false },
            }),
            Kind::Partial { .. } | Kind::Failed { .. } => None,
        }
    }
}

impl<B> Body for Buffered<B>
where
    B: Body + Unpin,
    B::Data: Buf,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match &mut self.get_mut().kind {
            Kind::Whole { data, trailers, sent_data } => {
                if !*sent_data {
                    *sent_data = true;
                    if !data.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(data.clone()))));
                    }
                }
                Poll::Ready(trailers.take().map(|trailers| Ok(Frame::trailers(trailers))))
            }
            Kind::Partial { read, rest } => {
                if let Some(read) = read.take() {
                    return Poll::Ready(Some(Ok(Frame::data(read))));
                }
                let Some(rest) = rest.as_mut() else { return Poll::Ready(None) };
                Pin::new(rest).poll_frame(cx).map(|frame| {
                    frame
                        .map(|frame| frame.map(|frame| frame.map_data(|mut data| data.copy_to_bytes(data.remaining()))))
                })
            }
            Kind::Failed { read, error } => match read.take() {
                Some(read) => Poll::Ready(Some(Ok(Frame::data(read)))),
                None => Poll::Ready(error.take().map(Err)),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Whole { data, trailers, sent_data } => (*sent_data || data.is_empty()) && trailers.is_none(),
            Kind::Partial { read, rest } => read.is_none() && rest.as_ref().is_none_or(Body::is_end_stream),
            Kind::Failed { read, error } => read.is_none() && error.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Whole { data, sent_data, .. } => SizeHint::with_exact(if *sent_data { 0 } else { data.len() as u64 }),
            Kind::Partial { read, rest } => {
                let read = read.as_ref().map_or(0, |read| read.len() as u64);
                let rest = rest.as_ref().map(Body::size_hint).unwrap_or_else(|| SizeHint::with_exact(0));
                let mut hint = SizeHint::new();
                hint.set_lower(rest.lower().saturating_add(read));
                if let Some(upper) = rest.upper() {
                    hint.set_upper(upper.saturating_add(read));
                }
                hint
            }
            Kind::Failed { .. } => SizeHint::new(),
        }
    }
}
