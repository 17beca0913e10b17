//! Dispatch's tests: placement over calibrated workers, batch caps,
//! prices, admission past saturation, prefix affinity, bought capacity,
//! drift, the split's cost model and round-robin, each through the
//! decision a relay acts on.

use std::time::Instant;

use super::decide::worker_target;
use super::*;
use crate::fleet::registry::Registration;
use crate::services::placement::Terms;
use money::ledger::amount::{BPS, Prices};

/// A dispatcher over `fleet` configured as `c`, unmetered.
fn with(fleet: &Arc<Registry>, c: DispatchConfig) -> Dispatch {
    Dispatch::new(fleet.clone(), c, None)
}

/// The decision for `w` as a replay takes it: its target and terms,
/// remembered as holding the prompt's prefix.
fn placed(d: &Dispatch, w: &Want<'_>, tried: &[String]) -> (Target, Terms) {
    let decision = d.decide(w, tried, false);
    d.ran_prefix(decision.target.key(), w.prompt);
    (decision.target, decision.terms)
}

fn profile(step_1: f64, step_4: f64) -> Profile {
    Profile {
        prefill_tokens_per_s: 1000.0,
        prefill_ms_long: 0.0,
        decode_step_ms_1: step_1,
        decode_step_ms_4: step_4,
        measured_at: 0,
    }
}

/// Gives a worker (or the house) its calibrated profile everywhere.
fn calibrate(fleet: &Registry, d: &Dispatch, ids: &[&String], p: Profile) {
    for id in ids {
        fleet.set_profile(id, p);
        d.set_profile(id, p);
    }
}

/// A dispatcher placing by expected time alone, the house a fallback.
fn by_time(fleet: &Arc<Registry>) -> Dispatch {
    with(
        fleet,
        DispatchConfig {
            house_factor: 1000.0,
            weights: "latency=1".parse().expect("weights"),
            ..DispatchConfig::default()
        },
    )
}

/// A 10-token choice of at most 100 tokens on model `m`.
fn short(house: &Terms) -> Want<'_> {
    Want {
        model: "m",
        house,
        prompt: &[7; 10],
        max_tokens: 100,
        only: None,
    }
}

/// Places a choice of `prompt` on model `m` with the test house.
fn place(d: &Dispatch, tried: &[String], prompt: &[u32], max_tokens: usize) -> (Target, Terms) {
    let house = house();
    let w = Want {
        model: "m",
        house: &house,
        prompt,
        max_tokens,
        only: None,
    };
    placed(d, &w, tried)
}

fn house() -> Terms {
    Terms {
        provider_id: HOUSE_PROVIDER.into(),
        prices: Prices {
            input: 100_000_000,
            cached_input: 100_000_000,
            output: 100_000_000,
        },
        payout_bps: BPS,
        reputation_bps: BPS,
    }
}

fn worker(fleet: &Registry, name: &str) -> String {
    priced(fleet, name, None)
}

/// A worker asking `output` (net, ticks per million tokens) for `m`.
fn priced(fleet: &Registry, name: &str, output: Option<i64>) -> String {
    let asks = output
        .map(|o| protocol::Ask {
            model: "m".into(),
            input: o,
            cached_input: o,
            output: o,
            capacity: 0,
            until: 0,
            preemptible: false,
        })
        .into_iter()
        .collect();
    let (tx, _rx) = mpsc::channel(1);
    let id = fleet.register(Registration::for_test(name, asks), tx);
    std::mem::forget(_rx);
    id
}

#[test]
fn placement_prefers_the_measured_fastest_until_its_batch_makes_it_slower() {
    let fleet = Arc::new(Registry::default());
    let d = by_time(&fleet);
    // Uncalibrated workers get nothing: the house it is.
    let (fast, slow) = (worker(&fleet, "fast"), worker(&fleet, "slow"));
    assert_eq!(place(&d, &[], &[7; 10], 100).0, Target::House);
    calibrate(&fleet, &d, &[&fast], profile(5.0, 8.0));
    calibrate(&fleet, &d, &[&slow], profile(40.0, 45.0));
    let key = |t: (Target, Terms)| t.0.key().to_string();
    assert_eq!(key(place(&d, &[], &[7; 10], 100)), fast);
    // Loaded enough that the slow one now finishes first.
    d.measure(&fast, |m| m.outstanding = 40);
    assert_eq!(key(place(&d, &[], &[7; 10], 100)), slow);
    // A lost job doubles the correction: less work until it recovers.
    d.measure(&fast, |m| m.outstanding = 0);
    d.measure(&fast, |m| m.correction = 16.0);
    assert_eq!(key(place(&d, &[], &[7; 10], 100)), slow);
    // What just failed this job is not tried again.
    assert_eq!(
        key(place(&d, std::slice::from_ref(&slow), &[7; 10], 100)),
        fast
    );
    // Observed gaps near the prediction bring the correction back.
    for _ in 0..200 {
        d.measure(&fast, |m| m.observe(5.0));
    }
    assert_eq!(key(place(&d, &[], &[7; 10], 100)), fast);
}

#[test]
fn a_full_executor_is_passed_over_and_its_cap_follows_the_observed_steps() {
    let fleet = Arc::new(Registry::default());
    let d = with(
        &fleet,
        DispatchConfig {
            house_factor: 1000.0,
            step_target_ms: 20.0,
            weights: "latency=1".parse().expect("weights"),
            ..DispatchConfig::default()
        },
    );
    let (fast, slow) = (worker(&fleet, "fast"), worker(&fleet, "slow"));
    calibrate(&fleet, &d, &[&fast], profile(5.0, 8.0));
    calibrate(&fleet, &d, &[&slow], profile(40.0, 45.0));
    let cap = |id: &str| d.measures.lock().expect("measures")[id].cap;
    // 5 ms + 1 ms per extra sequence stays under 20 ms up to 16.
    assert_eq!(cap(&fast), 16);
    let key = |t: (Target, Terms)| t.0.key().to_string();
    d.measure(&fast, |m| m.outstanding = 15);
    assert_eq!(key(place(&d, &[], &[7; 10], 100)), fast);
    d.measure(&fast, |m| m.outstanding = 16);
    assert_eq!(key(place(&d, &[], &[7; 10], 100)), slow, "fast is full");
    // A step that misses the target shrinks the cap x0.7.
    d.measure(&fast, |m| m.adapt(30.0, 20.0));
    assert_eq!(cap(&fast), 11);
    // Well under the target while full: it grows again.
    d.measure(&fast, |m| {
        m.outstanding = 11;
        m.adapt(5.0, 20.0);
    });
    assert_eq!(cap(&fast), 12);
    // Everyone full: the fastest all the same (the house, weighed by
    // its factor, stays the fallback).
    d.measure(&slow, |m| m.outstanding = 1_000);
    d.measure(&fast, |m| m.outstanding = 1_000);
    assert_eq!(key(place(&d, &[], &[7; 10], 100)), fast);
}

#[test]
fn the_cheaper_of_equally_fast_workers_gets_the_choice_at_its_own_terms() {
    let fleet = Arc::new(Registry::default());
    let d = with(
        &fleet,
        DispatchConfig {
            house_factor: 1000.0,
            ..DispatchConfig::default()
        },
    );
    let (cheap, dear, taker) = (
        priced(&fleet, "cheap", Some(40_000_000)),
        priced(&fleet, "dear", Some(80_000_000)),
        worker(&fleet, "taker"),
    );
    calibrate(&fleet, &d, &[&cheap, &dear, &taker], profile(5.0, 8.0));
    let (target, terms) = place(&d, &[], &[7; 10], 100);
    assert_eq!(target.key(), cheap);
    // Its ask, as a user pays it (no billing here: no fee), and its
    // provider's standing: a new provider at 1.0x, paid 1.0x.
    assert_eq!(
        (terms.provider_id.as_str(), terms.prices.output),
        ("provider:cheap", 40_000_000)
    );
    assert_eq!(terms.reputation_bps, BPS);
    assert_eq!(terms.payout_bps, BPS);
    // Busy to its cap, the cheap one is passed over for the next cheapest.
    d.measure(&cheap, |m| m.outstanding = m.cap);
    assert_eq!(place(&d, &[], &[7; 10], 100).0.key(), dear);
    // A worker with no ask takes the house's prices.
    let (_, t) = place(&d, &[cheap.clone(), dear.clone()], &[7; 10], 100);
    assert_eq!(
        (t.provider_id.as_str(), t.prices),
        ("provider:taker", house().prices)
    );
}

#[tokio::test]
async fn past_saturation_a_choice_waits_for_room_and_gives_up_at_its_deadline() {
    let fleet = Arc::new(Registry::default());
    let d = Arc::new(with(
        &fleet,
        DispatchConfig {
            step_target_ms: 20.0,
            max_queue: 1,
            queue_timeout: Duration::from_millis(200),
            ..DispatchConfig::default()
        },
    ));
    let w = worker(&fleet, "w");
    for key in [HOUSE, w.as_str()] {
        d.set_profile(key, profile(5.0, 8.0));
    }
    fleet.set_profile(&w, profile(5.0, 8.0));
    let (_abort_tx, mut abort) = watch::channel(false);
    let h = house();
    let want = short(&h);
    assert!(!d.saturated(&want));
    assert!(d.wait_for_room(&want, &mut abort).await, "room: no wait");
    for key in [HOUSE, w.as_str()] {
        d.measure(key, |m| m.outstanding = m.cap);
    }
    assert!(d.saturated(&want));
    // Nobody leaves: it gives up at its deadline.
    let t = Instant::now();
    assert!(!d.wait_for_room(&want, &mut abort).await);
    assert!(t.elapsed() >= Duration::from_millis(200));
    // Someone leaves while it waits: it goes on.
    let waiter = {
        let d = d.clone();
        tokio::spawn(async move {
            let (_tx, mut abort) = watch::channel(false);
            let h = house();
            d.wait_for_room(&short(&h), &mut abort).await
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(d.queued(), 1);
    d.measure(&w, |m| m.outstanding -= 1);
    d.admission.room_made();
    assert!(waiter.await.expect("task"));
    assert_eq!(d.queued(), 0);
}

#[test]
fn a_worker_that_ran_the_prompt_prefix_is_credited_for_its_cache() {
    let fleet = Arc::new(Registry::default());
    let d = by_time(&fleet);
    let (a, b) = (worker(&fleet, "a"), worker(&fleet, "b"));
    calibrate(&fleet, &d, &[&a, &b], profile(5.0, 8.0));
    let p: Vec<u32> = (0..512).collect();
    let q: Vec<u32> = (1_000..1_512).collect();
    let first = place(&d, &[], &p, 10).0.key().to_string();
    let other = if first == a { b.clone() } else { a.clone() };
    d.measure(&first, |m| m.outstanding += 1);
    // Busier, but it holds the prefix: it saves the 512-token prefill.
    assert_eq!(place(&d, &[], &p, 10).0.key(), first);
    // A prompt it never ran goes to the idle one.
    assert_eq!(place(&d, &[], &q, 10).0.key(), other);
}

#[test]
fn capacity_bought_from_a_provider_runs_on_its_executors() {
    let fleet = Arc::new(Registry::default());
    let d = with(&fleet, DispatchConfig::default());
    let (cheap, seller) = (
        priced(&fleet, "cheap", Some(1_000_000)),
        priced(&fleet, "seller", Some(90_000_000)),
    );
    calibrate(&fleet, &d, &[&cheap, &seller], profile(5.0, 8.0));
    let h = house();
    let want = |only| Want {
        model: "m",
        house: &h,
        prompt: &[7; 10],
        max_tokens: 100,
        only,
    };
    assert_eq!(placed(&d, &want(None), &[]).0.key(), cheap);
    let only = want(Some("provider:seller"));
    assert_eq!(placed(&d, &only, &[]).0.key(), seller);
    assert!(d.can_serve("m", "provider:seller") && d.can_serve("m", HOUSE_PROVIDER));
    assert!(!d.can_serve("m", "provider:nobody"));
    // The house's capacity runs on the house engine.
    let house_only = want(Some(HOUSE_PROVIDER));
    assert_eq!(placed(&d, &house_only, &[]).0, Target::House);
}

#[test]
fn a_worker_whose_steps_drift_from_its_profile_gets_less_work_and_is_flagged() {
    let fleet = Arc::new(Registry::default());
    let d = by_time(&fleet);
    let (a, b) = (worker(&fleet, "a"), worker(&fleet, "b"));
    calibrate(&fleet, &d, &[&a, &b], profile(5.0, 8.0));
    assert!(!d.drifted(&a) && !d.drifted(&b));
    // `a` now takes 4x its profile's step: its correction follows.
    for _ in 0..200 {
        d.measure(&a, |m| m.observe(20.0));
    }
    assert!(d.drifted(&a), "calibration should measure it again");
    let p: Vec<u32> = (0..64).collect();
    assert_eq!(place(&d, &[], &p, 50).0.key(), b, "less work meanwhile");
    // A recalibration resets the correction.
    d.set_profile(&a, profile(20.0, 24.0));
    assert!(!d.drifted(&a));
}

/// A profile with this prefill throughput and a 5 ms decode step.
fn prefilling(tokens_per_s: f64) -> Profile {
    Profile {
        prefill_tokens_per_s: tokens_per_s,
        ..profile(5.0, 8.0)
    }
}

#[test]
fn the_cost_model_splits_a_long_prompt_onto_a_much_faster_prefill_worker() {
    let fleet = Arc::new(Registry::default());
    let (gpu, cpu) = (worker(&fleet, "gpu"), worker(&fleet, "cpu"));
    let d = with(
        &fleet,
        DispatchConfig {
            weights: "latency=1".parse().expect("weights"),
            split: SplitMode::Auto,
            ..DispatchConfig::default()
        },
    );
    calibrate(&fleet, &d, &[&gpu], prefilling(100_000.0));
    calibrate(&fleet, &d, &[&cpu], prefilling(500.0));
    let h = house();
    let want = |prompt: &'static [u32], max_tokens| Want {
        model: "m",
        house: &h,
        prompt,
        max_tokens,
        only: None,
    };
    let decode = worker_target(&fleet.list().into_iter().find(|w| w.id == cpu).expect("cpu"));
    static LONG: [u32; 2048] = [7; 2048];
    // 2,048 tokens: 4 s of prefill on the decode worker, 20 ms on the
    // other, and 8 KB of KV (this model's geometry) to move.
    let (colocated, plan) = d.split_for(&want(&LONG, 16), &decode, &h);
    let plan = plan.expect("a split");
    assert_eq!(plan.prefill.key(), gpu);
    assert!((colocated.ttft_ms - 4096.0).abs() < 1.0, "{colocated:?}");
    assert!(plan.estimate.ttft_ms < 25.0, "{:?}", plan.estimate);
    assert_eq!(plan.estimate.kv_bytes, 2048 * 4);
    // A short prompt stays where it is.
    static SHORT: [u32; 20] = [7; 20];
    assert!(d.split_for(&want(&SHORT, 16), &decode, &h).1.is_none());
    // One token to generate: nothing to decode elsewhere.
    assert!(d.split_for(&want(&LONG, 1), &decode, &h).1.is_none());
    // Decoding on the fast one, a slow prefill never pays.
    let fast = worker_target(&fleet.list().into_iter().find(|w| w.id == gpu).expect("gpu"));
    assert!(d.split_for(&want(&LONG, 16), &fast, &h).1.is_none());
    // `never` never splits; `always` does whenever it can.
    let split = |mode| {
        with(
            &fleet,
            DispatchConfig {
                split: mode,
                ..DispatchConfig::default()
            },
        )
    };
    let never = split(SplitMode::Never);
    calibrate(&fleet, &never, &[&gpu, &cpu], prefilling(1_000.0));
    assert!(never.split_for(&want(&LONG, 16), &decode, &h).1.is_none());
    let always = split(SplitMode::Always);
    calibrate(&fleet, &always, &[&gpu, &cpu], prefilling(1_000.0));
    let plan = always
        .split_for(&want(&LONG, 16), &fast, &h)
        .1
        .expect("always");
    assert_eq!(plan.prefill.key(), cpu);
}

#[test]
fn round_robin_takes_the_workers_in_turn() {
    let fleet = Arc::new(Registry::default());
    let d = with(
        &fleet,
        DispatchConfig {
            policy: PolicyKind::RoundRobin,
            ..DispatchConfig::default()
        },
    );
    let ids = [worker(&fleet, "a"), worker(&fleet, "b")];
    for id in &ids {
        fleet.set_profile(id, profile(5.0, 8.0));
    }
    let got: Vec<String> = (0..4)
        .map(|_| place(&d, &[], &[7; 1], 1).0.key().to_string())
        .collect();
    assert_eq!(got[0], got[2]);
    assert_eq!(got[1], got[3]);
    assert_ne!(got[0], got[1]);
}
