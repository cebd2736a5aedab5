//! Kubernetes Events, posted the same way by every kuryr-rs component: through kube-runtime's
//! recorder (events.k8s.io/v1, repeats of one reason folded into a series).

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType};
pub use kube::runtime::events::{Recorder, Reporter};

/// events.k8s.io caps a note at 1 kB.
const MAX_NOTE: usize = 1000;

/// Where a component's Events go: kube-runtime's recorder, or nowhere when the operator turned
/// them off (`[kubernetes] use_events = False`, as upstream's client: nothing is posted).
#[derive(Clone)]
pub struct Events {
    recorder: Recorder,
    enabled: bool,
}

impl Events {
    pub fn new(client: kube::Client, reporter: Reporter, enabled: bool) -> Self {
        Self {
            recorder: Recorder::new(client, reporter),
            enabled,
        }
    }

    /// Whether Events are posted at all.
    pub fn enabled(&self) -> bool {
        self.enabled
    }
}

/// Posts a Warning (or Normal) Event about `regarding` (nothing when Events are off). Callers
/// treat a failure as a courtesy lost, never as the failure of what they were doing.
pub async fn publish(
    events: &Events,
    regarding: &ObjectReference,
    warning: bool,
    reason: &str,
    note: &str,
    action: &str,
) -> Result<(), kube::Error> {
    let event = Event {
        type_: if warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: reason.to_string(),
        note: Some(note.chars().take(MAX_NOTE).collect()),
        action: action.to_string(),
        secondary: None,
    };
    if !events.enabled {
        return Ok(());
    }
    events.recorder.publish(&event, regarding).await
}
