//! What the core's test files share.

use persevere::Drain;

/// Every output `machine` has waiting, in its drain order.
pub(crate) fn drain<M: Drain>(machine: &mut M) -> Vec<M::Action> {
    machine.drain().collect()
}
