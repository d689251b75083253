//! What a run tells about itself: `metrics.jsonl` ([`metrics`]) and TensorBoard beside it
//! ([`tensorboard`]), the timeline of `events.jsonl` ([`events`]), the typed step report
//! ([`report`]), the simulation of the asynchronous pipeline from measured costs ([`sim`]), and
//! with the `plots` feature (on by default) the pictures and the HTML report ([`plot`], the one
//! user of `plotters`: an embedding trainer that needs no pictures leaves it out).

pub mod events;
pub mod metrics;
#[cfg(feature = "plots")]
pub mod plot;
pub mod report;
pub mod sim;
pub mod tensorboard;
