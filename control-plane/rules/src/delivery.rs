//! Where a job is on its way to its device, as one pure function: the jobs
//! seed's delivery states (created, sent, acked) plus expired, and what to do
//! next (send the intent, withdraw it from a broker). Every transport and
//! every kind of work goes through this one function; `dispatch/` runs
//! the effects.
//!
//! `Sent` lives in memory only: after a restart a job that was sent but not
//! acknowledged is simply sent again, which the agent answers from its store
//! (A1). `Created`, `Acked` and `Expired` are stored with the job.

use crate::records::Delivery;
use jiff::{SignedDuration, Timestamp};

/// What the delivery core knows about a job when an event arrives.
#[derive(Debug, Clone, PartialEq)]
pub struct JobFacts {
    pub delivery: Delivery,
    /// A status has been stored for the job.
    pub has_status: bool,
    /// The stored status is terminal: the job is decided.
    pub finished: bool,
    pub expires_at: Timestamp,
    pub cancel: Cancel,
}

/// Whether the job is being canceled, and whether its cancel order is out.
/// Only the request is stored (`cancel_requested_at`); whether the order got
/// out is kept in memory, like `Sent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancel {
    NotRequested,
    /// Requested; the order has not got out (or its delivery failed).
    Requested,
    /// The order was written to the device's connection or its broker.
    OrderOut,
}

#[derive(Debug, Clone, PartialEq)]
pub enum DeliveryEvent {
    /// Look at the job now: it was just released, or found.
    Consider { now: Timestamp },
    /// The link took the intent (written to the connection, or stored by a broker).
    Delivered { at: Timestamp },
    /// The agent recorded the job.
    Ack { at: Timestamp },
    /// A status was stored; `terminal` if it decides the job.
    Status { terminal: bool, at: Timestamp },
    /// The agent (re)connected; `holds` says whether it lists this job.
    Hello { holds: bool, at: Timestamp },
    /// The job's cancel was requested just now.
    Cancel,
    /// The sweeper's periodic look.
    Tick {
        now: Timestamp,
        ack_timeout: SignedDuration,
    },
    /// The broker that kept the device's intents lost them (its state was
    /// wiped): every undecided job's intent, or its cancel order, is put
    /// back.
    BrokerLost,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Send the intent to the device.
    Send,
    /// Withdraw the intent from wherever a broker keeps it.
    Withdraw,
    /// Send the signed cancel order; a broker keeps it in the intent's place.
    SendCancel,
}

/// The delivery transition table. Pure: same inputs, same outputs; every
/// arm is spelled out.
pub fn step(facts: &JobFacts, event: &DeliveryEvent) -> (Delivery, Vec<Effect>) {
    use Delivery::*;
    use DeliveryEvent as E;
    let unchanged = (facts.delivery.clone(), Vec::new());
    let acked = |at: Timestamp| acked(&facts.delivery, at);
    // A decided job is never sent again; its only effect is the withdrawal
    // when its terminal status first arrives.
    if facts.finished {
        return match event {
            E::Status { terminal: true, at } => (acked(*at), vec![Effect::Withdraw]),
            E::Consider { .. }
            | E::Delivered { .. }
            | E::Ack { .. }
            | E::Status { .. }
            | E::Hello { .. }
            | E::Cancel
            | E::Tick { .. }
            | E::BrokerLost => unchanged,
        };
    }
    if let Some(settled) = expired_or_status(facts, event) {
        return settled;
    }
    if facts.cancel != Cancel::NotRequested {
        return canceling(facts, event);
    }
    match (&facts.delivery, event) {
        (Expired { .. }, _) | (_, E::Status { .. }) => unchanged,
        (Created | Sent { .. }, E::Ack { at }) => (acked(*at), Vec::new()),
        (Acked { .. }, E::Ack { .. }) => unchanged,
        (Created, E::Consider { now }) => {
            if *now >= facts.expires_at && !facts.has_status {
                (Expired { at: *now }, vec![Effect::Withdraw])
            } else {
                (Created, vec![Effect::Send])
            }
        }
        (Sent { .. } | Acked { .. }, E::Consider { .. }) => unchanged,
        (Created | Sent { .. }, E::Delivered { at }) => (Sent { at: *at }, Vec::new()),
        (Acked { .. }, E::Delivered { .. }) => unchanged,
        (Created | Sent { .. }, E::Hello { holds: true, at }) => (acked(*at), Vec::new()),
        // Sent but not held: it was lost on the way; send it again now.
        (Created | Sent { .. }, E::Hello { holds: false, .. }) => (Created, vec![Effect::Send]),
        // The agent acknowledged it once; a hello without it means the agent
        // pruned or lost it. Sending it again could run it twice (A1).
        (Acked { .. }, E::Hello { .. }) => unchanged,
        (Created | Sent { .. }, E::Tick { now, .. })
            if *now >= facts.expires_at && !facts.has_status =>
        {
            (Expired { at: *now }, vec![Effect::Withdraw])
        }
        (Sent { at }, E::Tick { now, ack_timeout }) if now.duration_since(*at) >= *ack_timeout => {
            (Created, vec![Effect::Send])
        }
        (Created | Sent { .. } | Acked { .. }, E::Tick { .. }) => unchanged,
        // Only a job whose cancel is requested gets this event; see `canceling`.
        (Created | Sent { .. } | Acked { .. }, E::Cancel) => unchanged,
        // The intent goes back to the broker. A job the agent has reported
        // on stays acknowledged; one only acked by the transport counts as
        // not delivered, as the broker that took it lost it.
        (Acked { at }, E::BrokerLost) if facts.has_status => {
            (Acked { at: *at }, vec![Effect::Send])
        }
        (Created | Sent { .. } | Acked { .. }, E::BrokerLost) => (Created, vec![Effect::Send]),
    }
}

/// An acknowledgement at `at`; the first one's time is kept.
fn acked(delivery: &Delivery, at: Timestamp) -> Delivery {
    match delivery {
        Delivery::Acked { at } => Delivery::Acked { at: *at },
        _ => Delivery::Acked { at },
    }
}

/// What holds for every undecided job, canceled or not: an expired one
/// never goes out again (A3); a status acknowledges it, and a terminal one
/// withdraws it.
fn expired_or_status(facts: &JobFacts, event: &DeliveryEvent) -> Option<(Delivery, Vec<Effect>)> {
    match (&facts.delivery, event) {
        (Delivery::Expired { .. }, _) => Some((facts.delivery.clone(), Vec::new())),
        (_, DeliveryEvent::Status { terminal, at }) => {
            let effects = if *terminal {
                vec![Effect::Withdraw]
            } else {
                Vec::new()
            };
            Some((acked(&facts.delivery, *at), effects))
        }
        _ => None,
    }
}

/// The table of an undecided job whose cancel was requested: the intent
/// never goes out again; the cancel order goes wherever the intent would
/// (on the request, at every hello, after a restart, and until it got out
/// once). Acks, statuses and expiry keep their meaning: the job is decided by
/// the agent's status (Canceled, or the end of a job that had started) or
/// by its expiry.
fn canceling(facts: &JobFacts, event: &DeliveryEvent) -> (Delivery, Vec<Effect>) {
    use Delivery::*;
    use DeliveryEvent as E;
    let unchanged = (facts.delivery.clone(), Vec::new());
    let order = vec![Effect::SendCancel];
    let acked = |at: Timestamp| acked(&facts.delivery, at);
    let expired = |now: &Timestamp| {
        !matches!(facts.delivery, Acked { .. }) && *now >= facts.expires_at && !facts.has_status
    };
    match (&facts.delivery, event) {
        // Settled by `expired_or_status` before this table is asked.
        (Expired { .. }, _) | (_, E::Status { .. }) => unchanged,
        (_, E::Ack { at }) => (acked(*at), Vec::new()),
        (_, E::Delivered { at }) => match &facts.delivery {
            Created => (Sent { at: *at }, Vec::new()),
            _ => unchanged,
        },
        (_, E::Consider { now }) | (_, E::Tick { now, .. }) if expired(now) => {
            (Expired { at: *now }, vec![Effect::Withdraw])
        }
        (_, E::Cancel | E::Consider { .. } | E::BrokerLost) => (facts.delivery.clone(), order),
        (_, E::Hello { holds: true, at }) => (acked(*at), order),
        (_, E::Hello { holds: false, .. }) => (facts.delivery.clone(), order),
        (_, E::Tick { .. }) if facts.cancel == Cancel::Requested => (facts.delivery.clone(), order),
        (_, E::Tick { .. }) => unchanged,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Delivery::*;
    use DeliveryEvent as E;

    fn t(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).expect("time")
    }

    fn facts(delivery: Delivery, has_status: bool, finished: bool) -> JobFacts {
        JobFacts {
            delivery,
            has_status,
            finished,
            expires_at: t(1000),
            cancel: Cancel::NotRequested,
        }
    }

    fn canceled(delivery: Delivery, has_status: bool, cancel: Cancel) -> JobFacts {
        JobFacts {
            cancel,
            ..facts(delivery, has_status, false)
        }
    }

    fn tick(now: i64) -> DeliveryEvent {
        E::Tick {
            now: t(now),
            ack_timeout: SignedDuration::from_secs(60),
        }
    }

    #[test]
    fn delivery_table() {
        let send = vec![Effect::Send];
        let withdraw = vec![Effect::Withdraw];
        let order = vec![Effect::SendCancel];
        let none: Vec<Effect> = Vec::new();
        #[rustfmt::skip]
        let cases: Vec<(&str, JobFacts, DeliveryEvent, Delivery, Vec<Effect>)> = vec![
            ("released: send", facts(Created, false, false), E::Consider { now: t(0) }, Created, send.clone()),
            ("released after expiry: never sent", facts(Created, false, false), E::Consider { now: t(1000) }, Expired { at: t(1000) }, withdraw.clone()),
            ("sent", facts(Created, false, false), E::Delivered { at: t(1) }, Sent { at: t(1) }, none.clone()),
            ("considered again while sent: wait", facts(Sent { at: t(1) }, false, false), E::Consider { now: t(2) }, Sent { at: t(1) }, none.clone()),
            ("acked", facts(Sent { at: t(1) }, false, false), E::Ack { at: t(2) }, Acked { at: t(2) }, none.clone()),
            ("ack before the send was recorded", facts(Created, false, false), E::Ack { at: t(2) }, Acked { at: t(2) }, none.clone()),
            ("a second ack keeps the first time", facts(Acked { at: t(2) }, false, false), E::Ack { at: t(3) }, Acked { at: t(2) }, none.clone()),
            ("a status acks", facts(Sent { at: t(1) }, false, false), E::Status { terminal: false, at: t(3) }, Acked { at: t(3) }, none.clone()),
            ("a terminal status withdraws", facts(Acked { at: t(2) }, true, false), E::Status { terminal: true, at: t(9) }, Acked { at: t(2) }, withdraw.clone()),
            ("a decided job is never sent again", facts(Acked { at: t(2) }, true, true), tick(5000), Acked { at: t(2) }, none.clone()),
            ("a decided job ignores a hello", facts(Created, true, true), E::Hello { holds: false, at: t(3) }, Created, none.clone()),
            ("no ack in time: send again", facts(Sent { at: t(1) }, false, false), tick(61), Created, send.clone()),
            ("ack not yet due", facts(Sent { at: t(1) }, false, false), tick(60), Sent { at: t(1) }, none.clone()),
            ("hello holding it: acked", facts(Sent { at: t(1) }, false, false), E::Hello { holds: true, at: t(4) }, Acked { at: t(4) }, none.clone()),
            ("hello without it: lost on the way, send again", facts(Sent { at: t(1) }, false, false), E::Hello { holds: false, at: t(4) }, Created, send.clone()),
            ("hello of an agent that never got it", facts(Created, false, false), E::Hello { holds: false, at: t(4) }, Created, send.clone()),
            ("acked, then a hello without it: never twice (A1)", facts(Acked { at: t(2) }, true, false), E::Hello { holds: false, at: t(4) }, Acked { at: t(2) }, none.clone()),
            ("unacked past expiry: expired and withdrawn", facts(Sent { at: t(1) }, false, false), tick(1000), Expired { at: t(1000) }, withdraw.clone()),
            ("acked past expiry: it may run, never interrupted (A3)", facts(Acked { at: t(2) }, true, false), tick(2000), Acked { at: t(2) }, none.clone()),
            ("expired stays expired", facts(Expired { at: t(1000) }, false, false), E::Hello { holds: false, at: t(1001) }, Expired { at: t(1000) }, none.clone()),
            ("created waits on a tick (nobody reachable)", facts(Created, false, false), tick(10), Created, none.clone()),
            ("a cancel request: the order goes out", canceled(Created, false, Cancel::Requested), E::Cancel, Created, order.clone()),
            ("a cancel of an acked job: the order goes out", canceled(Acked { at: t(2) }, false, Cancel::Requested), E::Cancel, Acked { at: t(2) }, order.clone()),
            ("a cancel of a decided job: nothing", facts(Acked { at: t(2) }, true, true), E::Cancel, Acked { at: t(2) }, none.clone()),
            ("a cancel of an expired job: nothing", canceled(Expired { at: t(5) }, false, Cancel::Requested), E::Cancel, Expired { at: t(5) }, none.clone()),
            ("canceling, considered after a restart: the order, never the intent", canceled(Created, false, Cancel::Requested), E::Consider { now: t(3) }, Created, order.clone()),
            ("canceling, a hello without the job: the order, never the intent", canceled(Sent { at: t(1) }, false, Cancel::OrderOut), E::Hello { holds: false, at: t(4) }, Sent { at: t(1) }, order.clone()),
            ("canceling, a hello holding the job: acked, and the order", canceled(Sent { at: t(1) }, false, Cancel::OrderOut), E::Hello { holds: true, at: t(4) }, Acked { at: t(4) }, order.clone()),
            ("broker lost: a sent intent goes back", facts(Sent { at: t(1) }, false, false), E::BrokerLost, Created, send.clone()),
            ("broker lost: a created one goes out", facts(Created, false, false), E::BrokerLost, Created, send.clone()),
            ("broker lost: acked by the transport only, delivered again", facts(Acked { at: t(2) }, false, false), E::BrokerLost, Created, send.clone()),
            ("broker lost: reported on, stays acked and goes back", facts(Acked { at: t(2) }, true, false), E::BrokerLost, Acked { at: t(2) }, send.clone()),
            ("broker lost: a decided job stays out", facts(Acked { at: t(2) }, true, true), E::BrokerLost, Acked { at: t(2) }, none.clone()),
            ("broker lost: an expired job stays out", facts(Expired { at: t(5) }, false, false), E::BrokerLost, Expired { at: t(5) }, none.clone()),
            ("broker lost while canceling: the order, never the intent", canceled(Sent { at: t(1) }, false, Cancel::OrderOut), E::BrokerLost, Sent { at: t(1) }, order.clone()),
            ("canceling, no ack in time: the intent is not sent again", canceled(Sent { at: t(1) }, false, Cancel::OrderOut), tick(61), Sent { at: t(1) }, none.clone()),
            ("canceling, the order did not get out: a tick tries again", canceled(Created, false, Cancel::Requested), tick(10), Created, order.clone()),
            ("canceling, the agent's Canceled status: withdrawn", canceled(Sent { at: t(1) }, true, Cancel::OrderOut), E::Status { terminal: true, at: t(5) }, Acked { at: t(5) }, withdraw.clone()),
            ("canceling, a started job reports progress: wait for its end", canceled(Acked { at: t(2) }, true, Cancel::OrderOut), E::Status { terminal: false, at: t(5) }, Acked { at: t(2) }, none.clone()),
            ("canceling, the order's delivery", canceled(Created, false, Cancel::Requested), E::Delivered { at: t(3) }, Sent { at: t(3) }, none.clone()),
            ("canceling, never acked past expiry: expired", canceled(Sent { at: t(1) }, false, Cancel::OrderOut), tick(1000), Expired { at: t(1000) }, withdraw.clone()),
            ("canceling, acked past expiry: its status decides (A3)", canceled(Acked { at: t(2) }, false, Cancel::OrderOut), tick(2000), Acked { at: t(2) }, none.clone()),
        ];
        for (name, facts, event, delivery, effects) in cases {
            assert_eq!(step(&facts, &event), (delivery, effects), "{name}");
        }
    }
}
