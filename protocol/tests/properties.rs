//! Properties of the wire format, over generated messages and bytes
//! (proptest, seeded by its own persistence rules): every control message
//! survives encoding and decoding unchanged in both directions, and so
//! does every message between replicas on the fleet bus; every KV
//! frame does too, and a split's KV stream gathers only as sent; no byte string, however damaged, makes a decoder
//! panic; and a frame with any one byte changed is refused or reads as a
//! different frame, never as the original.

use proptest::prelude::*;
use protocol::bus::{BusEvent, BusMessage, Profile, WorkerInfo, decode_bus, encode_bus};
use protocol::kv_stream::{KvAssembly, KvDigest, frames_of};
use protocol::stage::{PartOffer, StageChunk, StageSampling};
use protocol::{
    Ask, Device, FromWorker, JobParams, JobToken, KvIncoming, Load, ServedModel, ToWorker, VERSION,
    decode, decode_frame, decode_from_server, encode, encode_frame, frame_transfer,
};

/// Floats that JSON carries exactly (finite, on a 1/1024 grid).
fn float() -> impl Strategy<Value = f32> {
    (-1_000_000i32..1_000_000).prop_map(|n| n as f32 / 1024.0)
}

fn text() -> impl Strategy<Value = String> {
    proptest::string::string_regex("[ -~\u{e9}\u{4e16}]{0,24}").expect("regex")
}

fn token() -> impl Strategy<Value = JobToken> {
    (
        any::<u32>(),
        proptest::option::of(float()),
        proptest::collection::vec((any::<u32>(), float()), 0..3),
    )
        .prop_map(|(id, logprob, top)| JobToken { id, logprob, top })
}

fn params() -> impl Strategy<Value = JobParams> {
    (
        (
            float(),
            float(),
            any::<u32>(),
            float(),
            any::<u64>(),
            any::<u32>(),
        ),
        (
            proptest::collection::vec(any::<u32>(), 0..4),
            any::<bool>(),
            (float(), float(), float()),
            proptest::collection::vec((any::<u32>(), float()), 0..3),
            proptest::option::of(any::<u32>()),
            any::<u64>(),
        ),
    )
        .prop_map(
            |((t, p, k, m, seed, max), (stops, eos, pen, bias, lp, tenant))| JobParams {
                temperature: t,
                top_p: p,
                top_k: k,
                min_p: m,
                seed,
                max_tokens: max,
                stop_token_ids: stops,
                ignore_eos: eos,
                repetition_penalty: pen.0,
                frequency_penalty: pen.1,
                presence_penalty: pen.2,
                logit_bias: bias,
                logprobs: lp,
                tenant,
            },
        )
}

fn served_model() -> impl Strategy<Value = ServedModel> {
    (text(), any::<[u32; 5]>()).prop_map(|(name, n)| ServedModel {
        name,
        layers: n[0],
        kv_heads: n[1],
        head_dim: n[2],
        block_size: n[3],
        context_length: n[4],
    })
}

fn register() -> impl Strategy<Value = FromWorker> {
    let device = (text(), text(), any::<u32>(), any::<u64>(), any::<bool>()).prop_map(
        |(kind, name, cores, memory_bytes, usable)| Device {
            kind,
            name,
            cores,
            memory_bytes,
            features: vec!["avx2".into()],
            usable,
        },
    );
    let ask = (
        text(),
        any::<[i64; 3]>(),
        any::<u64>(),
        any::<i64>(),
        any::<bool>(),
    )
        .prop_map(|(model, p, capacity, until, preemptible)| Ask {
            model,
            input: p[0],
            cached_input: p[1],
            output: p[2],
            capacity,
            until,
            preemptible,
        });
    (
        (text(), text(), proptest::collection::vec(device, 0..3)),
        (
            proptest::collection::vec(served_model(), 0..3),
            any::<u32>(),
            text(),
            proptest::collection::vec(ask, 0..3),
            proptest::collection::vec(text(), 0..3),
            proptest::collection::vec(part_offer(), 0..2),
        ),
    )
        .prop_map(
            |((name, build, devices), (models, threads, region, asks, encoders, parts))| {
                FromWorker::Register {
                    v: VERSION,
                    name,
                    build,
                    devices,
                    models,
                    threads,
                    region,
                    asks,
                    encoders,
                    parts,
                }
            },
        )
}

fn part_offer() -> impl Strategy<Value = PartOffer> {
    (text(), any::<[u32; 2]>(), any::<[u64; 4]>()).prop_map(|(model, n, b)| PartOffer {
        model,
        layers: n[0],
        hidden: n[1],
        layer_bytes: b[0],
        ends_bytes: b[1],
        kv_block_bytes: b[2],
        memory_bytes: b[3],
    })
}

fn stage_chunk() -> impl Strategy<Value = StageChunk> {
    let ids = proptest::collection::vec(any::<u32>(), 0..5);
    (
        any::<u64>(),
        ids.clone(),
        any::<[u32; 2]>(),
        ids.clone(),
        ids,
    )
        .prop_map(|(seq, tokens, n, draft, blocks)| StageChunk {
            seq,
            tokens,
            start: n[0],
            logits: n[1],
            draft,
            blocks,
        })
}

fn stage_sampling() -> impl Strategy<Value = StageSampling> {
    (
        (float(), float(), any::<u32>(), float()),
        (float(), float(), float()),
        proptest::collection::vec((any::<u32>(), float()), 0..3),
        (
            proptest::option::of(any::<u32>()),
            any::<u64>(),
            any::<u64>(),
        ),
        proptest::option::of((
            proptest::collection::vec(any::<(u32, u32)>(), 0..3),
            proptest::collection::vec(any::<u32>(), 0..3),
        )),
        proptest::option::of(proptest::collection::vec(any::<u64>(), 0..3)),
    )
        .prop_map(
            |(
                (temperature, top_p, top_k, min_p),
                pen,
                logit_bias,
                (logprobs, seed, position),
                penalties,
                allowed,
            )| {
                StageSampling {
                    temperature,
                    top_p,
                    top_k,
                    min_p,
                    repetition_penalty: pen.0,
                    frequency_penalty: pen.1,
                    presence_penalty: pen.2,
                    logit_bias,
                    logprobs,
                    seed,
                    position,
                    penalties,
                    allowed,
                }
            },
        )
}

fn from_worker() -> impl Strategy<Value = FromWorker> {
    let v = VERSION;
    prop_oneof![
        register(),
        (any::<[u32; 3]>(), float()).prop_map(move |(n, step_ms)| FromWorker::Status {
            v,
            load: Load {
                queued: n[0],
                running: n[1],
                free_kv_blocks: n[2],
                step_ms,
            },
        }),
        Just(FromWorker::Drain { v }),
        (any::<u64>(), any::<u32>()).prop_map(move |(job, attempt)| FromWorker::Accepted {
            v,
            job,
            attempt
        }),
        (
            any::<u64>(),
            any::<u32>(),
            proptest::collection::vec(token(), 0..4)
        )
            .prop_map(move |(job, attempt, tokens)| FromWorker::Tokens {
                v,
                job,
                attempt,
                tokens
            }),
        (any::<u64>(), any::<u32>(), text(), any::<[u32; 3]>()).prop_map(
            move |(job, attempt, reason, n)| FromWorker::Done {
                v,
                job,
                attempt,
                reason,
                prompt_tokens: n[0],
                cached_tokens: n[1],
                completion_tokens: n[2],
            }
        ),
        (any::<u64>(), any::<u32>(), text()).prop_map(move |(job, attempt, message)| {
            FromWorker::Failed {
                v,
                job,
                attempt,
                message,
            }
        }),
        (
            any::<u64>(),
            proptest::collection::vec(proptest::collection::vec(float(), 0..4), 0..3),
            any::<u32>()
        )
            .prop_map(move |(job, vectors, prompt_tokens)| FromWorker::Embedded {
                v,
                job,
                vectors,
                prompt_tokens,
            }),
        (any::<u64>(), any::<u32>(), any::<u64>(), any::<u32>()).prop_map(
            move |(job, attempt, transfer, from)| FromWorker::KvWant {
                v,
                job,
                attempt,
                transfer,
                from,
            }
        ),
        (
            any::<u64>(),
            any::<u32>(),
            text(),
            token(),
            any::<[u32; 2]>()
        )
            .prop_map(
                move |(transfer, tokens, digest, first, n)| FromWorker::KvEnd {
                    v,
                    transfer,
                    tokens,
                    digest,
                    first,
                    prompt_tokens: n[0],
                    cached_tokens: n[1],
                }
            ),
        (any::<u64>(), text()).prop_map(move |(transfer, message)| FromWorker::KvFailed {
            v,
            transfer,
            message
        }),
        (text(), any::<[u32; 3]>()).prop_map(move |(model, n)| FromWorker::PartLoaded {
            v,
            model,
            first: n[0],
            end: n[1],
            blocks: n[2],
        }),
        (text(), text()).prop_map(move |(model, message)| FromWorker::PartFailed {
            v,
            model,
            message
        }),
        (
            any::<u64>(),
            proptest::collection::vec(proptest::collection::vec(token(), 0..3), 0..3)
        )
            .prop_map(move |(step, tokens)| FromWorker::StageDone { v, step, tokens }),
        (any::<u64>(), text()).prop_map(move |(step, message)| FromWorker::StageFailed {
            v,
            step,
            message
        }),
        (
            any::<u64>(),
            any::<u32>(),
            any::<u64>(),
            any::<bool>(),
            text()
        )
            .prop_map(move |(job, attempt, transfer, imported, reason)| {
                FromWorker::KvResult {
                    v,
                    job,
                    attempt,
                    transfer,
                    imported,
                    reason,
                }
            }),
    ]
}

fn to_worker() -> impl Strategy<Value = ToWorker> {
    let v = VERSION;
    let ids = proptest::collection::vec(any::<u32>(), 0..6);
    prop_oneof![
        (text(), text(), any::<u64>()).prop_map(move |(worker_id, provider_id, heartbeat_ms)| {
            ToWorker::Welcome {
                v,
                worker_id,
                provider_id,
                heartbeat_ms,
            }
        }),
        (text(), text()).prop_map(move |(code, message)| ToWorker::Error { v, code, message }),
        Just(ToWorker::Drain { v }),
        any::<bool>().prop_map(move |paused| ToWorker::Pause { v, paused }),
        (
            (any::<u64>(), any::<u32>(), text()),
            (ids.clone(), ids.clone(), params()),
            proptest::option::of(any::<u64>()),
        )
            .prop_map(
                move |((job, attempt, model), (prompt, resume, params), kv)| {
                    ToWorker::Assign {
                        v,
                        job,
                        attempt,
                        model,
                        prompt,
                        resume,
                        params,
                        kv: kv.map(|transfer| KvIncoming { transfer }),
                    }
                }
            ),
        any::<u64>().prop_map(move |job| ToWorker::Cancel { v, job }),
        (
            any::<u64>(),
            text(),
            proptest::collection::vec(text(), 0..3),
            proptest::collection::vec(ids.clone(), 0..3),
            any::<bool>()
        )
            .prop_map(move |(job, model, texts, tokens, query)| ToWorker::Embed {
                v,
                job,
                model,
                texts,
                tokens,
                query,
            }),
        (any::<u64>(), text(), ids, params(), any::<u32>()).prop_map(
            move |(transfer, model, prompt, params, from)| ToWorker::Prefill {
                v,
                transfer,
                model,
                prompt,
                params,
                from,
            }
        ),
        (any::<u64>(), any::<u32>(), text(), token()).prop_map(
            move |(transfer, tokens, digest, first)| ToWorker::KvEnd {
                v,
                transfer,
                tokens,
                digest,
                first,
            }
        ),
        (any::<u64>(), text()).prop_map(move |(transfer, reason)| ToWorker::KvAbort {
            v,
            transfer,
            reason
        }),
        (text(), any::<[u32; 4]>()).prop_map(move |(model, n)| ToWorker::LoadPart {
            v,
            model,
            first: n[0],
            end: n[1],
            blocks: n[2],
            block_size: n[3],
        }),
        text().prop_map(move |model| ToWorker::DropPart { v, model }),
        (
            any::<u64>(),
            text(),
            proptest::collection::vec(stage_chunk(), 0..3),
            any::<u32>(),
            proptest::collection::vec(proptest::option::of(stage_sampling()), 0..3)
        )
            .prop_map(
                move |(step, model, chunks, rows, sampling)| ToWorker::StageStep {
                    v,
                    step,
                    model,
                    chunks,
                    rows,
                    sampling,
                }
            ),
    ]
}

/// A model whose geometry every generated frame fits.
fn model() -> ServedModel {
    ServedModel {
        name: "m".into(),
        layers: 32,
        kv_heads: 2,
        head_dim: 4,
        block_size: 16,
        context_length: 1 << 16,
    }
}

/// A frame the model's geometry accepts: `tokens` tokens of one layer.
fn frame() -> impl Strategy<Value = (u64, u32, u32, Vec<u8>)> {
    let per_token = model().kv_bytes_per_token() as usize;
    (any::<u64>(), 0..32u32, 0..1000u32, 1..40usize).prop_flat_map(
        move |(transfer, layer, first, tokens)| {
            proptest::collection::vec(any::<u8>(), tokens * per_token)
                .prop_map(move |payload| (transfer, layer, first, payload))
        },
    )
}

/// A float JSON carries exactly, as f64.
fn wide() -> impl Strategy<Value = f64> {
    float().prop_map(f64::from)
}

/// A worker as its replica announces it, from a registration's fields.
fn worker_info() -> impl Strategy<Value = WorkerInfo> {
    let profile =
        (wide(), wide(), wide(), wide(), any::<i64>()).prop_map(|(p, l, d1, d4, at)| Profile {
            prefill_tokens_per_s: p,
            prefill_ms_long: l,
            decode_step_ms_1: d1,
            decode_step_ms_4: d4,
            measured_at: at,
        });
    let load = (any::<[u32; 3]>(), float()).prop_map(|(n, step_ms)| Load {
        queued: n[0],
        running: n[1],
        free_kv_blocks: n[2],
        step_ms,
    });
    (
        register(),
        (text(), text(), text(), text(), text()),
        (
            any::<[i64; 4]>(),
            proptest::option::of(profile),
            load,
            wide(),
        ),
        any::<[u64; 3]>(),
    )
        .prop_map(
            |(reg, (id, replica, provider_id, token_id, state), (n, profile, load, rtt_ms), c)| {
                let FromWorker::Register {
                    name,
                    build,
                    devices,
                    models,
                    threads,
                    region,
                    asks,
                    encoders,
                    parts,
                    ..
                } = reg
                else {
                    unreachable!("register() makes registrations")
                };
                WorkerInfo {
                    id,
                    replica,
                    provider_id,
                    token_id,
                    name,
                    build,
                    remote: "10.0.0.1:4000".into(),
                    devices,
                    models,
                    encoders,
                    parts,
                    holds: vec![],
                    threads,
                    region,
                    asks,
                    reputation_bps: n[0],
                    uptime_bps: n[1],
                    state,
                    profile,
                    load,
                    rtt_ms,
                    jobs_running: c[0],
                    tokens_delivered: c[1],
                    jobs_lost: c[2],
                    connected_at: n[2],
                    last_seen: n[3],
                }
            },
        )
}

fn bus_event() -> impl Strategy<Value = BusEvent> {
    prop_oneof![
        Just(BusEvent::Accepted),
        token().prop_map(|t| BusEvent::Token {
            id: t.id,
            logprob: t.logprob,
            top: t.top,
        }),
        (text(), any::<[u32; 3]>()).prop_map(|(reason, n)| BusEvent::Finished {
            reason,
            prompt: n[0] as usize,
            cached: n[1] as usize,
            completion: n[2] as usize,
        }),
        text().prop_map(|why| BusEvent::Lost { why }),
    ]
}

fn bus_message() -> impl Strategy<Value = BusMessage> {
    prop_oneof![
        (text(), proptest::collection::vec(worker_info(), 0..3))
            .prop_map(|(replica, workers)| BusMessage::Announce { replica, workers }),
        (text(), text(), to_worker()).prop_map(|(origin, worker, msg)| BusMessage::ToWorker {
            origin,
            worker,
            msg: Box::new(msg),
        }),
        (
            any::<u64>(),
            any::<u32>(),
            text(),
            proptest::collection::vec(bus_event(), 0..4)
        )
            .prop_map(|(job, attempt, worker, events)| BusMessage::Events {
                job,
                attempt,
                worker,
                events,
            }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn every_workers_message_round_trips(msg in from_worker()) {
        let text = serde_json::to_string(&msg).expect("encodes");
        prop_assert_eq!(decode(&text).expect("decodes"), msg);
    }

    #[test]
    fn every_servers_message_round_trips(msg in to_worker()) {
        prop_assert_eq!(decode_from_server(&encode(&msg)).expect("decodes"), msg);
    }

    #[test]
    fn every_bus_message_round_trips(msg in bus_message()) {
        prop_assert_eq!(decode_bus(encode_bus(&msg).as_bytes()).expect("decodes"), msg);
    }

    /// Any byte of a split's frames changed, or a frame cut short, and
    /// the decode side refuses the whole transfer, never panicking.
    #[test]
    fn a_mangled_kv_stream_never_verifies(
        changes in proptest::collection::vec(
            (any::<prop::sample::Index>(), any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in proptest::option::of((any::<prop::sample::Index>(), any::<prop::sample::Index>())),
    ) {
        let per = 2 * 2 * 4 * 2;
        let layers: Vec<Vec<u8>> = (0..32)
            .map(|l| (0..40 * per).map(|i| (i * 7 + l * 3) as u8).collect())
            .collect();
        let frames = frames_of(9, 0, 40, &layers);
        let mut digest = KvDigest::default();
        frames.iter().for_each(|f| digest.frame(f));
        let digest = digest.hex();
        let mut fs = frames.clone();
        for (f, at, byte) in changes {
            let f = f.index(fs.len());
            let at = at.index(fs[f].len());
            fs[f][at] = byte;
        }
        if let Some((f, at)) = cut {
            let f = f.index(fs.len());
            let keep = at.index(fs[f].len() + 1);
            fs[f].truncate(keep);
        }
        let mut kv = KvAssembly::new(9, model(), 0);
        fs.iter().for_each(|f| kv.push(f));
        let verified = kv.finish(40, &digest, 40);
        if fs == frames {
            prop_assert!(verified.is_ok());
        } else {
            prop_assert!(verified.is_err(), "a mangled stream verified");
        }
    }

    #[test]
    fn frames_round_trip((transfer, layer, first, payload) in frame()) {
        let tokens = (payload.len() / model().kv_bytes_per_token() as usize) as u32;
        let bytes = encode_frame(transfer, layer, first, tokens, &payload);
        prop_assert_eq!(frame_transfer(&bytes), Ok(transfer));
        let (h, got) = decode_frame(&bytes, &model()).expect("decodes");
        prop_assert_eq!((h.transfer, h.layer, h.first_token, h.tokens), (transfer, layer, first, tokens));
        prop_assert_eq!(got, &payload[..]);
    }

    #[test]
    fn one_changed_byte_never_reads_as_the_original_frame(
        (transfer, layer, first, payload) in frame(),
        at in any::<prop::sample::Index>(),
        flip in 1..=255u8,
    ) {
        let tokens = (payload.len() / model().kv_bytes_per_token() as usize) as u32;
        let mut bytes = encode_frame(transfer, layer, first, tokens, &payload);
        let (original, _) = decode_frame(&bytes, &model()).expect("decodes");
        let i = at.index(bytes.len());
        bytes[i] ^= flip;
        if let Ok((h, got)) = decode_frame(&bytes, &model()) {
            prop_assert!(h != original || got != &payload[..], "byte {} changed unnoticed", i);
        }
    }

    #[test]
    fn no_bytes_make_a_decoder_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = decode_frame(&bytes, &model());
        let _ = frame_transfer(&bytes);
        let text = String::from_utf8_lossy(&bytes);
        let _ = decode(&text);
        let _ = decode_from_server(&text);
        let _ = decode_bus(&bytes);
    }

    #[test]
    fn damaged_messages_are_refused_or_decode_never_panicking(
        msg in from_worker(),
        at in any::<prop::sample::Index>(),
        with in any::<char>(),
    ) {
        let mut text: Vec<char> = serde_json::to_string(&msg).expect("encodes").chars().collect();
        let i = at.index(text.len());
        text[i] = with;
        let text: String = text.into_iter().collect();
        let _ = decode(&text);
        let _ = decode_from_server(&text);
    }
}
