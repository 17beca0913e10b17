//! Placement, as pure decisions over plain numbers: how one executor is
//! scored (`score`: its measure, terms and the weighted log-score), which
//! prefixes executors likely hold (`affinity`), which candidate a choice
//! goes to (`policy`: a `Policy` over a `Snapshot`, made by a factory
//! from `--placement`), and whether its prompt prefills elsewhere
//! (`disagg`: the disaggregation cost model). Nothing here locks, awaits
//! or reads the fleet: `services::dispatch` builds the snapshots from
//! what it observed and acts on the decisions.

pub mod affinity;
pub mod disagg;
pub mod policy;
pub mod score;

pub use affinity::{AFFINITY_BLOCK, Affinity, prefix_hashes};
pub use disagg::{Estimate, SplitMode};
pub use policy::{Policy, PolicyKind, Snapshot, policy};
pub use score::{Candidate, FULL_PENALTY, MAX_CAP, Measure, Terms, Weights, gross};
