//! Tier tests: L1 then L2 then L3, promotion on a hit, L2 surviving a new
//! cache (a restart), a second cache on the same Redis (a replica) hitting
//! in L3, and a Redis outage degrading to misses, never errors.

use std::time::{Duration, Instant};

use super::answer::{CachedAnswer, CachedChoice};
use super::verify::Reject;
use super::*;

pub(crate) fn answer(scope: &str, model: &str, text: &str) -> CachedAnswer {
    CachedAnswer {
        scope: scope.into(),
        model: model.into(),
        choices: vec![CachedChoice {
            text: text.into(),
            finish_reason: "stop".into(),
        }],
        prompt_tokens: 5,
        completion_tokens: 2,
        provider_id: "provider:house".into(),
        created_at: 0,
        prices: None,
    }
}

fn config(dir: &std::path::Path, redis: Option<&str>) -> CacheConfig {
    CacheConfig {
        l1_bytes: 1 << 20,
        l2_dir: Some(dir.to_path_buf()),
        l2_bytes: 1 << 20,
        redis_url: redis.map(str::to_string),
        ttl: Duration::from_secs(60),
        policy: semantic::Policy {
            threshold: 0.95,
            verify: true,
            align: None,
            delta: None,
            judge: None,
        },
        semantic: semantic::Limits {
            per_index: 100,
            total: 1000,
            ttl: Duration::from_secs(60),
        },
    }
}

/// The local Redis (started if it is down, as the machine notes say).
pub(crate) fn redis_url() -> String {
    let up = || {
        std::process::Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", "6379", "ping"])
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"PONG"))
    };
    if !up() {
        let _ = std::process::Command::new("sh")
            .args(["-c", "redis-server --daemonize yes >/dev/null 2>&1"])
            .status();
        for _ in 0..50 {
            if up() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    "redis://127.0.0.1:6379/".into()
}

fn tmp() -> PathBuf {
    std::env::temp_dir().join(format!("synor-cache-{}", uuid::Uuid::new_v4().simple()))
}

#[tokio::test]
async fn hits_come_from_the_nearest_tier_and_promote_upwards() {
    let url = redis_url();
    let key = format!("t-{}", uuid::Uuid::new_v4().simple());
    let (d1, d2) = (tmp(), tmp());
    let a = ResponseCache::new(&config(&d1, Some(&url))).expect("cache");
    assert!(a.get("s", "m", &key).await.is_none());
    a.put(&key, answer("s", "m", "Paris")).await;
    let (hit, tier) = a.get("s", "m", &key).await.expect("hit");
    assert_eq!((hit.choices[0].text.as_str(), tier), ("Paris", Tier::L1));
    // A restart: a new cache over the same folder hits in L2, then L1.
    let restarted = ResponseCache::new(&config(&d1, None)).expect("cache");
    assert_eq!(
        restarted.get("s", "m", &key).await.map(|h| h.1),
        Some(Tier::L2)
    );
    assert_eq!(
        restarted.get("s", "m", &key).await.map(|h| h.1),
        Some(Tier::L1)
    );
    // A replica: its own folder, the same Redis: L3, then L1.
    let replica = ResponseCache::new(&config(&d2, Some(&url))).expect("cache");
    assert_eq!(
        replica.get("s", "m", &key).await.map(|h| h.1),
        Some(Tier::L3)
    );
    assert_eq!(
        replica.get("s", "m", &key).await.map(|h| h.1),
        Some(Tier::L1)
    );
    assert_eq!(replica.stats()[2].hits.get(), 1);
    // Flush by scope reaches every tier.
    let gone = replica.flush(Some("s"), None).await;
    assert!(gone[0] >= 1 && gone[1] >= 1 && gone[2] >= 1, "{gone:?}");
    assert!(replica.get("s", "m", &key).await.is_none());
}

#[tokio::test]
async fn a_redis_outage_is_a_miss_not_an_error() {
    // Nothing listens on this port: every Redis call fails fast.
    let c = ResponseCache::new(&config(&tmp(), Some("redis://127.0.0.1:1/"))).expect("cache");
    c.put("k", answer("s", "m", "x")).await;
    assert_eq!(c.get("s", "m", "k").await.map(|h| h.1), Some(Tier::L1));
    assert!(c.get("s", "m", "other").await.is_none());
    assert_eq!(c.flush(None, None).await[2], 0);
}

#[tokio::test]
async fn l1_is_bounded_by_bytes() {
    let mut cfg = config(&tmp(), None);
    cfg.l1_bytes = 4_000;
    cfg.l2_dir = None;
    let c = ResponseCache::new(&cfg).expect("cache");
    for i in 0..100 {
        c.put(&format!("k{i}"), answer("s", "m", &"y".repeat(200)))
            .await;
    }
    c.settle_l1().await;
    let (bytes, entries, _, _) = c.sizes();
    assert!(
        bytes <= 4_000 && entries < 100,
        "{bytes} bytes, {entries} entries"
    );
}

#[test]
fn semantic_policies_are_per_model_and_lookups_count_rejections_and_similarity() {
    let dir = tmp();
    let c = ResponseCache::new(&config(&dir, None)).expect("cache");
    let change = |threshold, verify| PolicyChange {
        threshold,
        verify,
        align: None,
        delta: None,
        judge: None,
    };
    assert_eq!(c.policy("m").threshold, 0.95);
    let own = c.set_policy(Some("m"), change(Some(0.6), None));
    assert_eq!((own.threshold, own.verify), (0.6, true));
    assert_eq!(c.policy("m"), own);
    assert_eq!(
        c.policy("other").threshold,
        0.95,
        "the default is untouched"
    );
    c.set_policy(None, change(None, Some(false)));
    assert!(!c.policy("other").verify);
    assert!(
        c.policy("m").verify,
        "a model's own policy outlives a new default"
    );
    let aligned = c.set_policy(
        Some("m"),
        PolicyChange {
            align: Some(0.7),
            ..PolicyChange::default()
        },
    );
    assert_eq!(aligned.align, Some(0.7));
    assert_eq!(
        c.set_policy(
            Some("m"),
            PolicyChange {
                align: Some(0.0),
                ..PolicyChange::default()
            }
        )
        .align,
        None
    );

    let ik = IndexKey {
        scope: "s".into(),
        model: "m".into(),
        context: "c".into(),
    };
    let v = vec![1.0, 0.0];
    c.semantic_put(ik.clone(), v.clone(), "Convert 10 miles to km", "k".into());
    let near = [0.99f32, 0.141];
    let facts = Facts::of("Convert 10 km to miles");
    assert_eq!(c.semantic_get(&ik, &near, &facts), None);
    assert!(
        c.semantic_get(&ik, &near, &Facts::of("How many km is 10 miles?"))
            .is_some()
    );
    let direction = Reject::ALL
        .iter()
        .position(|r| *r == Reject::Direction)
        .expect("reason");
    assert_eq!(c.semantic_counts.rejections[direction].get(), 1);
    let seen: u64 = c.semantic_counts.similarity.get_sample_count();
    assert_eq!(seen, 2, "every lookup's nearest similarity is counted");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn under_a_bound_a_near_match_is_probed_learned_and_counted() {
    let dir = tmp();
    let c = ResponseCache::new(&config(&dir, None)).expect("cache");
    let bound = |d| PolicyChange {
        delta: Some(d),
        ..PolicyChange::default()
    };
    assert_eq!(c.set_policy(Some("m"), bound(0.05)).delta, Some(0.05));
    let ik = IndexKey {
        scope: "s".into(),
        model: "m".into(),
        context: "c".into(),
    };
    c.semantic_put(
        ik.clone(),
        vec![1.0, 0.0],
        "How many km is 10 miles?",
        "k".into(),
    );
    let near = [0.99f32, 0.141];
    let asked = Facts::of("Convert 10 miles to kilometers");
    let Some(Found::Probe(p)) = c.semantic_get(&ik, &near, &asked) else {
        panic!("nothing learned yet: a probe");
    };
    assert_eq!((p.found.key.as_str(), p.explore), ("k", 1.0));
    c.semantic_observe(&ik, &p, true);
    let tally = c.semantic_counts.learned_all();
    let m = &tally["m"];
    assert_eq!((m.served, m.probed, m.verified, m.failed), (0, 1, 1, 0));
    // The model's pool learns: enough agreeing outcomes at 0.99 and
    // differing ones far below, and the near match is served.
    for i in 0..800 {
        c.semantic_observe(&ik, &p, true);
        let low = Probe {
            found: Match {
                similarity: 0.5 + (i % 20) as f32 * 0.01,
                ..p.found.clone()
            },
            explore: 1.0,
        };
        c.semantic_observe(&ik, &low, false);
    }
    let served = (0..50)
        .filter(|_| matches!(c.semantic_get(&ik, &near, &asked), Some(Found::Hit(_))))
        .count();
    assert!(served >= 40, "{served} of 50 served once learned");
    assert!(!c.semantic_thresholds(false).is_empty());
    assert!(c.semantic_thresholds(true).is_empty());
    // Another tenant's near match is not decided by this one's outcomes.
    let other = IndexKey {
        scope: "t".into(),
        ..ik.clone()
    };
    c.semantic_put(
        other.clone(),
        vec![1.0, 0.0],
        "How many km is 10 miles?",
        "k2".into(),
    );
    assert!(matches!(
        c.semantic_get(&other, &near, &asked),
        Some(Found::Probe(_))
    ));
    // The bound off: the verifier alone decides again.
    c.set_policy(Some("m"), bound(0.0));
    assert!(matches!(
        c.semantic_get(&ik, &near, &asked),
        Some(Found::Hit(_))
    ));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn under_a_judge_a_near_match_passing_the_structure_goes_to_the_judge() {
    let dir = tmp();
    let c = ResponseCache::new(&config(&dir, None)).expect("cache");
    let judge = PolicyChange {
        judge: Some(0.8),
        delta: Some(0.05),
        ..PolicyChange::default()
    };
    let p = c.set_policy(Some("m"), judge);
    assert_eq!((p.judge, p.delta), (Some(0.8), Some(0.05)));
    let ik = IndexKey {
        scope: "s".into(),
        model: "m".into(),
        context: "c".into(),
    };
    let cached = "How do I reverse a list in Python?";
    c.semantic_put(ik.clone(), vec![1.0, 0.0], cached, "k".into());
    let near = [0.99f32, 0.141];
    // Other topic words: the judge weighs them (the verifier alone would
    // refuse), and the bound waits while a judge is on.
    let asked = Facts::of("How do I reverse a string in Python?");
    match c.semantic_get(&ik, &near, &asked) {
        Some(Found::Judge(m, q)) => assert_eq!((m.key.as_str(), q.as_str()), ("k", cached)),
        other => panic!("to the judge: {other:?}"),
    }
    // The structure is still a rule.
    let other = Facts::of("How do I reverse a list in Rust?");
    assert_eq!(c.semantic_get(&ik, &near, &other), None);
    // A shared cache's questions are other tenants' text: never judged
    // (here the bound decides, having learned nothing: a probe).
    let shared = IndexKey {
        scope: SHARED_SCOPE.into(),
        ..ik.clone()
    };
    c.semantic_put(shared.clone(), vec![1.0, 0.0], cached, "s".into());
    for q in [
        asked.clone(),
        Facts::of("How can I reverse a list in Python?"),
    ] {
        assert!(matches!(
            c.semantic_get(&shared, &near, &q),
            Some(Found::Probe(_))
        ));
    }
    let Some(Found::Judge(m, _)) = c.semantic_get(&ik, &near, &asked) else {
        panic!("to the judge");
    };
    let t = Instant::now();
    // Under the bound the judge's chance is what is learned over: nothing
    // learned yet, even a sure judge is probed.
    let Some(Err(probe)) = c.semantic_judged(&ik, m.clone(), Some(0.97), t) else {
        panic!("nothing learned yet: a probe");
    };
    assert_eq!((probe.found.judged, probe.explore), (Some(0.97), 1.0));
    // A failed judge is a plain miss.
    assert_eq!(c.semantic_judged(&ik, m.clone(), None, t), None);
    // Agreeing outcomes where the judge was sure, differing ones where it
    // was not: the sure ones are served, the unsure still probed.
    for i in 0..800 {
        c.semantic_observe(&ik, &probe, true);
        let low = Probe {
            found: Match {
                judged: Some(0.2 + (i % 20) as f32 * 0.01),
                ..probe.found.clone()
            },
            explore: 1.0,
        };
        c.semantic_observe(&ik, &low, false);
    }
    let served = (0..50)
        .filter(|_| {
            matches!(
                c.semantic_judged(&ik, m.clone(), Some(0.97), t),
                Some(Ok(_))
            )
        })
        .count();
    assert!(served >= 40, "{served} of 50 served once learned");
    assert!(matches!(
        c.semantic_judged(&ik, m.clone(), Some(0.39), t),
        Some(Err(_))
    ));
    // Learned on the judge's chance, not on the similarity.
    assert!(!c.semantic_thresholds(true).is_empty());
    assert!(c.semantic_thresholds(false).is_empty());
    let judged = &c.semantic_counts.learned_all()["m"];
    assert_eq!(judged.judged_same + judged.judged_different, 53);
    // Without a bound the judge's cut decides.
    c.set_policy(
        Some("m"),
        PolicyChange {
            delta: Some(0.0),
            ..PolicyChange::default()
        },
    );
    let hits = c.semantic_stats().hits.get();
    assert!(matches!(
        c.semantic_judged(&ik, m.clone(), Some(0.81), t),
        Some(Ok(_))
    ));
    assert_eq!(c.semantic_judged(&ik, m.clone(), Some(0.79), t), None);
    assert_eq!(c.semantic_stats().hits.get(), hits + 1);
    // The judge off: the verifier decides again.
    c.set_policy(
        Some("m"),
        PolicyChange {
            judge: Some(0.0),
            delta: Some(0.0),
            ..PolicyChange::default()
        },
    );
    assert_eq!(c.semantic_get(&ik, &near, &asked), None);
    let _ = std::fs::remove_dir_all(dir);
}
