//! The conformance suite: every behaviour of the lock contract written once and run on all six
//! engines. [`conformance!`] stamps each behaviour out as one `#[tokio::test]` per engine, named
//! `conformance::<engine>::<behaviour>` (e.g.
//! `conformance::redis::mutual_exclusion_with_many_contenders`), so
//! `cargo test -p dlock-tests --test conformance etcd::` runs one engine and
//! `cargo test -p dlock-tests --test conformance fences` one behaviour everywhere
//! (`conformance_shared::` for read-write locks and semaphores). `scripts/test` runs the suite
//! with every other test under cargo-nextest, many at once: its tests spend most of their time
//! waiting on leases and on servers of their own (`.config/nextest.toml` caps how many
//! ZooKeeper, etcd and Cluster tests run together).
//!
//! Each test starts its own servers ([`fixture::Fixture`]) and connects several runtimes to
//! them; separate runtimes stand for separate processes (on the memory engine, whose state
//! lives in one runtime, its tasks are the contenders). What differs between engines is only
//! what their documentation says differs ([`fixture::Params`]: the shortest lease etcd and
//! ZooKeeper can honour, notification latency, no fences on Redlock); no engine skips a
//! behaviour, except the one the memory engine cannot have: going down on its own (see
//! [`conformance!`]).
//!
//! Engine-specific faults (kill a Redlock minority, restart etcd, expire a ZooKeeper session,
//! fail over a Cluster shard, Redis layout) stay in the engine's own test file.

mod config;
mod events;
mod exclusion;
mod exit_paths;
mod fair;
mod faults;
mod fencing;
mod fixture;
mod hold;
mod inspect;
mod lease;
mod multi;
mod reentrancy;
mod shared;
mod support;
mod waiting;

/// Generates one module per engine (inside `conformance`) with one `#[tokio::test]` per
/// `area::behaviour`, each calling `area::behaviour(Engine::..)`: the behaviours listed under
/// `every engine` on all six, those under `engines with servers` on all but memory.
macro_rules! conformance {
    (
        every engine: $($area:ident :: $behaviour:ident),+ ;
        engines with servers: $($s_area:ident :: $s_behaviour:ident),+ $(,)?
    ) => {
        mod conformance {
            conformance!(@engine memory, Memory, $($area::$behaviour),+);
            conformance!(@engine redis, Redis, $($area::$behaviour,)+ $($s_area::$s_behaviour),+);
            conformance!(@engine cluster, Cluster, $($area::$behaviour,)+ $($s_area::$s_behaviour),+);
            conformance!(@engine redlock, Redlock, $($area::$behaviour,)+ $($s_area::$s_behaviour),+);
            conformance!(@engine etcd, Etcd, $($area::$behaviour,)+ $($s_area::$s_behaviour),+);
            conformance!(@engine zookeeper, ZooKeeper, $($area::$behaviour,)+ $($s_area::$s_behaviour),+);
        }
    };
    (@engine $module:ident, $engine:ident, $($area:ident :: $behaviour:ident),+) => {
        mod $module {
            $(
                #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $behaviour() {
                    crate::$area::$behaviour(crate::fixture::Engine::$engine).await;
                }
            )+
        }
    };
}

conformance!(
    every engine:
    exclusion::mutual_exclusion_with_many_contenders,
    exit_paths::release_on_return_err_and_explicit_release,
    exit_paths::release_on_panic_and_cancellation_while_holding,
    exit_paths::cancelled_waiter_leaves_nothing_behind,
    exit_paths::cancellation_mid_acquire_leaves_nothing_behind,
    exit_paths::guards_dropped_at_tokio_shutdown_are_released,
    waiting::wait_timeout_returns_timeout_within_bounds,
    waiting::release_wakes_a_waiter_long_before_the_lease,
    lease::watchdog_keeps_a_short_lease_alive,
    lease::with_lock_bodies_keep_a_short_lease_alive,
    lease::a_holder_blocking_its_thread_keeps_its_lease,
    lease::watchdog_off_lease_is_a_hard_cap,
    lease::deleted_key_is_lost,
    fencing::fences_strictly_increase_across_holders,
    reentrancy::nested_acquisition_reenters_and_inner_exit_keeps_the_hold,
    reentrancy::other_tasks_and_plain_acquires_are_other_owners,
    reentrancy::current_fence_is_the_innermost_holds,
    reentrancy::concurrent_branches_of_a_chain_are_different_owners,
    reentrancy::reentrant_guard_kept_past_its_chain_is_lost,
    config::bad_configuration_is_invalid_config,
    config::keys_over_the_limit_are_invalid_and_at_the_limit_work,
    events::events_tell_acquired_renewed_timeout_lost_and_released,
    inspect::held_locks_are_listed_with_their_holder,
    inspect::reentered_lock_is_one_hold_with_the_outer_fence,
    inspect::waiters_are_not_holders,
    inspect::reservations_and_foreign_values_are_not_holders,
    hold::a_short_run_keeps_the_key_until_hold_at_least,
    hold::a_run_longer_than_hold_at_least_releases_at_once,
    multi::opposite_orders_never_deadlock,
    multi::a_set_with_one_busy_key_takes_none_of_them,
    multi::one_guard_covers_every_key,
    multi::losing_one_key_loses_the_set,
    multi::a_set_reenters_the_keys_its_chain_holds,
    multi::the_watchdog_renews_every_key_of_a_set,
    fair::fair_waiters_acquire_in_the_order_they_queued,
    fair::a_dead_waiter_does_not_block_the_line,
    fair::a_waiter_that_gives_up_leaves_the_line;

    // The memory engine lives inside its runtime: it cannot be killed or restarted while the
    // runtime holds a lock (a process crash takes the holder with it), so the engine-down
    // behaviour has nothing to check there.
    engines with servers:
    faults::engine_down_while_held_is_lost_and_waiters_acquire_after_restart,
);

/// Read-write locks and semaphores: stamped like [`conformance!`] under `conformance_shared::`
/// (`conformance_shared::etcd::readers_truly_overlap`) on every engine but Redlock, which has
/// neither and gets the behaviour of its clear error instead.
macro_rules! shared_conformance {
    (
        every engine: $($behaviour:ident),+ ;
        engines with servers: $($s_behaviour:ident),+ ;
        redlock: $($r_behaviour:ident),+ $(,)?
    ) => {
        mod conformance_shared {
            conformance!(@engine memory, Memory, $(shared::$behaviour),+);
            conformance!(@engine redis, Redis, $(shared::$behaviour,)+ $(shared::$s_behaviour),+);
            conformance!(@engine cluster, Cluster, $(shared::$behaviour,)+ $(shared::$s_behaviour),+);
            conformance!(@engine etcd, Etcd, $(shared::$behaviour,)+ $(shared::$s_behaviour),+);
            conformance!(@engine zookeeper, ZooKeeper, $(shared::$behaviour,)+ $(shared::$s_behaviour),+);
            conformance!(@engine redlock, Redlock, $(shared::$r_behaviour),+);
        }
    };
}

shared_conformance!(
    every engine:
    readers_truly_overlap,
    a_writer_excludes_readers_and_writers,
    a_waiting_writer_is_not_starved_by_readers,
    a_waiting_fair_writer_is_not_starved_by_readers,
    a_semaphore_never_exceeds_its_permits,
    a_semaphore_of_another_size_is_invalid_config,
    read_and_write_reentrancy_rules,
    a_readers_release_hands_nothing_to_a_waiting_writer,
    shared_holds_are_inspected_with_their_mode_and_holders,
    force_unlock_removes_readers_and_permits_and_wakes_waiters;
    engines with servers:
    a_killed_permit_holder_frees_its_permit;
    redlock:
    redlock_refuses_read_locks_and_semaphores,
);
