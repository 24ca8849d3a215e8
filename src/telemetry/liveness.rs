//! The liveness gauges: seconds since each function's last invocation and last success, and its consecutive
//! failures (docs/operations.md pages on them).
//!
//! Why they read the triggers directly instead of the status poll's snapshots: they are what an operator pages
//! on when something is down, and the status poll drops a function from its gauges while its database or state
//! store fails. These come from memory (`Trigger::liveness`), so they report through any outage.

use crate::engine::Trigger;
use opentelemetry::metrics::Meter;
use opentelemetry::KeyValue;
use std::sync::Arc;

pub(super) fn register_gauges(meter: &Meter, triggers: &[Arc<Trigger>]) {
    fn each(triggers: &[Arc<Trigger>], mut f: impl FnMut(&Trigger, &[KeyValue])) {
        for trigger in triggers {
            f(trigger, &[KeyValue::new("function", trigger.name().to_string())]);
        }
    }
    let t = triggers.to_vec();
    meter
        .f64_observable_gauge("sql_trigger.seconds_since_last_invocation")
        .with_description(
            "Seconds since this instance last ran a tick of the function (an invocation by the host, or a turn of handler run's loop); since the process started when it has not yet.",
        )
        .with_unit("s")
        .with_callback(move |o| each(&t, |tr, attrs| o.observe(tr.liveness().seconds_since_invocation(tr.now()), attrs)))
        .build();
    let t = triggers.to_vec();
    meter
        .f64_observable_gauge("sql_trigger.seconds_since_last_success")
        .with_description(
            "Seconds since this instance's last tick of the function that ended without an error; since the process started when none has.",
        )
        .with_unit("s")
        .with_callback(move |o| each(&t, |tr, attrs| o.observe(tr.liveness().seconds_since_success(tr.now()), attrs)))
        .build();
    let t = triggers.to_vec();
    meter
        .u64_observable_gauge("sql_trigger.consecutive_failures")
        .with_description(
            "Ticks of the function on this instance that ended with an error since the last that did not.",
        )
        .with_unit("{tick}")
        .with_callback(move |o| each(&t, |tr, attrs| o.observe(tr.liveness().consecutive_failures, attrs)))
        .build();
}
