//! Policies stored once: a task's row names its policy by an id in `persevere_policies`, so
//! that the ~500 bytes of a policy are not written again with every write of every task (see
//! the schema's notes in `postgres.rs`). Each connection keeps the ids it has used.

use std::collections::HashMap;

use super::Postgres;
use crate::QueueError;

/// How many policies a connection remembers the ids of; past that it forgets them all (an
/// application that makes a new policy for each task pays one lookup per task).
const MAX_REMEMBERED: usize = 256;

/// The ids of the policies a connection has stored or found.
#[derive(Debug, Default)]
pub(super) struct PolicyIds {
    ids: HashMap<String, i64>,
}

impl Postgres {
    /// The id of each of `policies` (JSON texts), in order (one for each): remembered, found,
    /// or stored now.
    ///
    /// A policy is never changed or deleted once stored, so an id found once stays right.
    /// Storing one is idempotent: two connections storing the same text at once store it once
    /// (the unique index on its digest), and each then finds it.
    pub(super) fn policy_ids(&mut self, policies: &[&str]) -> Result<Vec<i64>, QueueError> {
        let mut unknown: Vec<&str> =
            policies.iter().copied().filter(|p| !self.policy_ids.ids.contains_key(*p)).collect();
        unknown.sort_unstable();
        unknown.dedup();
        if !unknown.is_empty() {
            if self.policy_ids.ids.len() + unknown.len() > MAX_REMEMBERED {
                self.policy_ids.ids.clear();
            }
            self.find_policies(&unknown)?;
            let still: Vec<&str> = unknown.into_iter().filter(|p| !self.policy_ids.ids.contains_key(*p)).collect();
            if !still.is_empty() {
                self.store_policies(&still)?;
                self.find_policies(&still)?;
            }
        }
        policies
            .iter()
            .map(|policy| {
                self.policy_ids.ids.get(*policy).copied().ok_or_else(|| QueueError::NotAQueue {
                    path: "persevere_policies".into(),
                    reason: format!(
                        "it holds another policy with the same MD5 digest as {policy}, so this one cannot be stored"
                    ),
                })
            })
            .collect()
    }

    /// Remembers the ids of those of `policies` that are stored.
    fn find_policies(&mut self, policies: &[&str]) -> Result<(), QueueError> {
        let select = self.prepared(
            "SELECT p.id, p.policy FROM unnest($1::text[]) AS wanted(policy)
             JOIN persevere_policies p ON md5(p.policy) = md5(wanted.policy) AND p.policy = wanted.policy",
        )?;
        for row in self.block_on(self.client.query(&select, &[&policies]))? {
            self.policy_ids.ids.insert(row.try_get(1)?, row.try_get(0)?);
        }
        Ok(())
    }

    /// Stores `policies`, but for those another connection stored meanwhile.
    fn store_policies(&mut self, policies: &[&str]) -> Result<(), QueueError> {
        let insert = self.prepared(
            "INSERT INTO persevere_policies (policy) SELECT * FROM unnest($1::text[])
             ON CONFLICT ((md5(policy))) DO NOTHING",
        )?;
        self.block_on(self.client.execute(&insert, &[&policies]))?;
        Ok(())
    }
}
