//! The liveness watchdog on a manual clock: a function whose timer stops is reported once per period after two
//! missed firings, not while it is paused or halted, and again only after it ran and went quiet anew; the
//! failure streak and the last success move with each tick's end (what status and the gauges export).
use sql_pseudo_trigger::clock::ManualClock;
use sql_pseudo_trigger::config::ncrontab::Schedule;
use sql_pseudo_trigger::config::Mode;
use sql_pseudo_trigger::engine::operate::Action;
use sql_pseudo_trigger::engine::Trigger;
use sql_pseudo_trigger::sink::SinkError;
use sql_pseudo_trigger::state::MemoryStore;
use sql_pseudo_trigger::watchdog::{look, runner_period};
use std::sync::Arc;
use std::time::Duration;
use testbed::MemorySource;

struct World {
    source: Arc<MemorySource>,
    clock: ManualClock,
    trigger: Trigger,
}

/// A function on the host's timer every ten seconds, on a manual clock.
fn world(schedule: Option<&str>) -> World {
    let mut config = testbed::config::function("orders", testbed::config::settings());
    config.schedule = schedule.map(|s| Schedule::parse(s).expect("schedule"));
    let source = Arc::new(MemorySource::new());
    let clock = ManualClock::default();
    let trigger = Trigger::new(config, "app", source.clone(), Arc::new(MemoryStore::new()), "handler-1".into())
        .with_clock(Arc::new(clock.clone()));
    trigger.liveness();
    World { source, clock, trigger }
}

impl World {
    fn wait(&self, seconds: u64) {
        self.clock.advance(Duration::from_secs(seconds));
    }

    async fn tick(&self) -> bool {
        self.trigger.tick(&testbed::attempts::first()).await.is_ok()
    }
}

#[tokio::test]
async fn a_timer_that_stops_is_reported_after_two_missed_firings_then_once_per_period() {
    // GIVEN a function fired every ten seconds, which just ran
    let w = world(Some("*/10 * * * * *"));
    assert!(w.tick().await);
    let mut reported = look(&w.trigger, Mode::Host, None);
    assert_eq!(reported, None, "just invoked");

    // WHEN the timer stops: one missed firing is not yet a silence
    w.wait(12);
    reported = look(&w.trigger, Mode::Host, reported);
    assert_eq!(reported, None, "one firing missed");

    // THEN after two missed firings (and half a period of slack) it is reported
    w.wait(20);
    reported = look(&w.trigger, Mode::Host, reported);
    let first = reported.expect("silent for three periods: reported");
    // AND not again within the same period
    w.wait(5);
    reported = look(&w.trigger, Mode::Host, reported);
    assert_eq!(reported, Some(first), "once per period");
    // AND again a period later
    w.wait(5);
    reported = look(&w.trigger, Mode::Host, reported);
    assert!(reported.is_some_and(|at| at > first), "reported again after a period");

    // WHEN the timer fires again, the silence ends
    assert!(w.tick().await);
    assert_eq!(look(&w.trigger, Mode::Host, reported), None);
}

#[tokio::test]
async fn a_function_never_invoked_is_reported_counting_from_the_start() {
    let w = world(Some("*/10 * * * * *"));
    w.wait(35);
    assert!(look(&w.trigger, Mode::Host, None).is_some(), "no invocation since start for three periods");
    let status = w.trigger.status().await.expect("status");
    assert!(status.seconds_since_last_invocation.is_some_and(|s| s >= 35.0), "{status:?}");
}

#[tokio::test]
async fn a_first_firing_that_comes_seconds_after_ready_raises_no_alarm_and_one_that_never_comes_does() {
    // GIVEN a function on an every-second timer, watched from the moment the handler was ready
    let w = world(Some("* * * * * *"));

    // WHEN the host starts its timer late, as a Flex instance does (up to 10 s), THEN nothing is reported
    w.wait(10);
    assert_eq!(look(&w.trigger, Mode::Host, None), None, "a late first firing is a host starting, not a silence");
    assert!(w.tick().await);
    assert_eq!(look(&w.trigger, Mode::Host, None), None);

    // AND on another handler whose timer never fires, the silence is reported once the grace is spent
    let never = world(Some("* * * * * *"));
    never.wait(30);
    assert_eq!(look(&never.trigger, Mode::Host, None), None, "within 30 s of ready");
    never.wait(1);
    assert!(look(&never.trigger, Mode::Host, None).is_some(), "30 s after ready with no firing");
}

#[tokio::test]
async fn a_paused_function_is_not_reported_however_long_it_is_quiet() {
    // GIVEN a function an operator paused, whose last tick saw the pause
    let w = world(Some("*/10 * * * * *"));
    assert!(w.tick().await);
    w.trigger.operate(Action::Pause, "test").await.expect("pause");
    assert!(w.tick().await);

    // WHEN nothing invokes it for an hour THEN nothing is reported
    w.wait(3600);
    assert_eq!(look(&w.trigger, Mode::Host, None), None);
}

#[tokio::test]
async fn a_host_function_without_a_known_schedule_is_not_watched() {
    let w = world(None);
    w.wait(3600);
    assert_eq!(look(&w.trigger, Mode::Host, None), None);
}

#[tokio::test]
async fn the_run_loop_is_reported_after_two_of_its_periods() {
    // GIVEN `handler run`'s loop, which ticked once
    let w = world(None);
    assert!(w.tick().await);
    let period = runner_period(&w.trigger.config().settings, false);

    // WHEN it does not tick for two periods THEN it is not yet reported; a little after, it is
    w.clock.advance(period * 2);
    assert_eq!(look(&w.trigger, Mode::Runner, None), None);
    w.clock.advance(period);
    assert!(look(&w.trigger, Mode::Runner, None).is_some());
}

#[tokio::test]
async fn failures_count_up_until_a_tick_succeeds_and_status_reports_them() {
    // GIVEN a function that succeeded once
    let w = world(Some("*/10 * * * * *"));
    assert!(w.tick().await);
    w.wait(10);
    // WHEN the database is down for two ticks, ten seconds apart
    w.source.upsert([1], 1);
    w.source.fail_next_fetches(2);
    assert!(!w.tick().await);
    w.wait(10);
    assert!(!w.tick().await);
    w.wait(3);

    // THEN status says two failures in a row, the last success 23 s ago and the last invocation 3 s ago
    let status = w.trigger.status().await.expect("status");
    assert_eq!(status.consecutive_failures, Some(2));
    assert_eq!(status.seconds_since_last_success, Some(23.0));
    assert_eq!(status.seconds_since_last_invocation, Some(3.0));

    // WHEN the next tick succeeds THEN the streak ends
    assert!(w.tick().await);
    let status = w.trigger.status().await.expect("status");
    assert_eq!((status.consecutive_failures, status.seconds_since_last_success), (Some(0), Some(0.0)));
}

#[tokio::test]
async fn a_process_that_neither_ticks_nor_watches_reports_no_liveness() {
    // GIVEN a trigger as `handler state status` builds it: no tick, no watchdog
    let source = Arc::new(MemorySource::new());
    let config = testbed::config::function("orders", testbed::config::settings());
    let trigger = Trigger::new(config, "app", source, Arc::new(MemoryStore::new()), "cli".into());

    // THEN its status has no liveness numbers rather than a silence counted from its own start
    let status = trigger.status().await.expect("status");
    assert_eq!(status.seconds_since_last_invocation, None);
    assert_eq!(status.seconds_since_last_success, None);
    assert_eq!(status.consecutive_failures, None);
}

/// A sink that holds each delivery until released, saying when one has begun.
#[derive(Debug, Default)]
struct GateSink {
    entered: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

#[async_trait::async_trait]
impl sql_pseudo_trigger::sink::Sink for GateSink {
    async fn deliver(&self, _batch: &sql_pseudo_trigger::sink::SinkBatch<'_>) -> Result<(), SinkError> {
        self.entered.notify_one();
        self.release.notified().await;
        Ok(())
    }

    fn describe(&self) -> String {
        "gate".into()
    }
}

#[tokio::test]
async fn a_long_tick_is_not_a_silence_until_its_budget_is_spent() {
    // GIVEN a function on an every-second timer whose tick is held in its delivery
    let w = world(Some("* * * * * *"));
    let sink = Arc::new(GateSink::default());
    let trigger = Arc::new(w.trigger.with_sink(sink.clone()));
    w.source.upsert([1], 1);
    let running = {
        let trigger = trigger.clone();
        tokio::spawn(async move { trigger.tick(&testbed::attempts::first()).await })
    };
    sink.entered.notified().await;

    // WHEN most of its budget passes with the tick still running (far more than two periods) THEN that is not
    // a silence
    let budget = trigger.config().settings.tick_timeout;
    assert!(budget > Duration::from_secs(10), "the test's budget leaves room for several periods");
    w.clock.advance(budget - Duration::from_secs(1));
    assert_eq!(
        look(&trigger, Mode::Host, None),
        None,
        "a tick within its budget is running, not silent: {:?}",
        trigger.heard()
    );

    // WHEN its budget is spent with no end recorded THEN it is
    w.clock.advance(Duration::from_secs(1));
    assert!(look(&trigger, Mode::Host, None).is_some(), "a tick past its budget is silence");

    // WHEN it ends THEN the quiet counts from its end
    sink.release.notify_one();
    // (its budget is real time, which has not passed: it ends well)
    running.await.expect("the tick's task").expect("the tick ends");
    assert_eq!(look(&trigger, Mode::Host, None), None, "just ended");
}
