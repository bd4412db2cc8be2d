//! Per-message cost of the session's protocol tracking: the response queue
//! for one extended-protocol round, and `SessionGuard` for a pgbench-style
//! prepared select (the steady state of ordinary traffic), next to the
//! saver's checkpoint read and `__interrupt__` write rounds (which decode
//! and audit).
//!
//! `cargo bench --bench wire`

mod common;

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use resumeguard::enforce::SessionGuard;
use resumeguard::wire::guard::Guard;
use resumeguard::wire::response_queue::{Expect, Progress, ResponseQueue, Route};

fn response_queue(c: &mut Criterion) {
    let mut g = c.benchmark_group("response_queue");
    // Parse/Bind/Describe(P)/Execute/Sync -> 1 2 T D C Z: 5 pushes, 6 server messages.
    g.throughput(Throughput::Elements(11));
    let mut q: ResponseQueue<u32> = ResponseQueue::new();
    g.bench_function("parse_bind_describe_execute_sync_round", |b| {
        b.iter(|| {
            for expect in [
                Expect::ParseComplete,
                Expect::BindComplete,
                Expect::DescribePortal,
                Expect::Execute,
                Expect::Sync,
            ] {
                q.push(black_box(expect), Route::Forward, None);
            }
            let mut done = 0;
            for tag in *b"12TDCZ" {
                if let Progress::Completed { route, .. } = q.on_server(black_box(tag)).unwrap() {
                    debug_assert_eq!(route, Route::Forward);
                    done += 1;
                }
            }
            assert!(q.idle());
            done
        })
    });
    g.finish();
}

fn round(st: &mut SessionGuard, r: &common::PgbenchRound) -> usize {
    for f in &r.client {
        st.on_client(black_box(f), false).unwrap();
    }
    let mut forwarded = 0;
    for f in &r.server {
        let v = st.on_server(black_box(f)).unwrap();
        forwarded += (v.route == Route::Forward) as usize;
    }
    forwarded
}

fn session_state(c: &mut Criterion) {
    let mut g = c.benchmark_group("session_state");

    let r = common::pgbench_prepared_round();
    g.throughput(Throughput::Elements(
        (r.client.len() + r.server.len()) as u64,
    ));
    let mut st = common::prepared_session("P0_1", common::PGBENCH_SELECT_PREPARED, &[]);
    assert_eq!(round(&mut st, &r), 5);
    assert!(st.is_idle() && st.hooks.ready_events.is_empty());
    g.bench_function("pgbench_prepared_select_round", |b| {
        b.iter(|| round(&mut st, &r))
    });

    let r = common::checkpoint_read_round();
    g.throughput(Throughput::Elements(
        (r.client.len() + r.server.len()) as u64,
    ));
    let mut st = common::prepared_session("_pg3_1", &common::read_latest_sql(), &[0, 0]);
    round(&mut st, &r);
    assert!(
        !st.hooks.ready_events.is_empty(),
        "checkpoint read produced no audit event"
    );
    g.bench_function("checkpoint_read_round", |b| {
        b.iter(|| {
            let n = round(&mut st, &r);
            st.hooks.ready_events.clear();
            n
        })
    });

    let r = common::interrupt_write_round();
    g.throughput(Throughput::Elements(
        (r.client.len() + r.server.len()) as u64,
    ));
    let mut st = common::prepared_session(
        "_pg3_2",
        common::saver_sql::UPSERT_WRITES,
        &[0, 0, 0, 0, 0, 21, 0, 0, 17],
    );
    round(&mut st, &r);
    assert!(
        !st.hooks.ready_events.is_empty(),
        "interrupt write produced no audit event"
    );
    g.bench_function("interrupt_write_round", |b| {
        b.iter(|| {
            let n = round(&mut st, &r);
            st.hooks.ready_events.clear();
            n
        })
    });
    g.finish();
}

criterion_group!(benches, response_queue, session_state);
criterion_main!(benches);
