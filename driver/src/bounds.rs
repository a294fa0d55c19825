//! Trait aliases: the bounds the [`Supervisor`](crate::Supervisor) and the
//! [`Scheduler`](crate::Scheduler) put on their type parameters, each named once. Every type
//! that meets a trait's bounds implements it; nothing implements them by hand.

use std::fmt;

use crate::Runtime;

/// A [`Runtime`] shared with the tasks a supervisor or a scheduler spawns: `Send + Sync +
/// 'static`, with timers that are `Send`.
pub trait SendRuntime: Runtime<Sleep: Send> + Send + Sync + 'static {}

impl<Rt> SendRuntime for Rt where Rt: Runtime<Sleep: Send> + Send + Sync + 'static {}

/// The id of a supervised task or of a scheduled flow: ordered (the registries are keyed by
/// it), cloned into events, shown in logs, and sent to the tasks that report on it.
pub trait Id: Ord + Clone + fmt::Debug + Send + 'static {}

impl<K> Id for K where K: Ord + Clone + fmt::Debug + Send + 'static {}

/// The error type of a supervised task's attempts or of a scheduled flow's runs: cloned into
/// events and statuses, and sent between tasks.
pub trait JobErrorType: Clone + Send + 'static {}

impl<E> JobErrorType for E where E: Clone + Send + 'static {}
