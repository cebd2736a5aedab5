//! Kubernetes Events, posted the same way by every kuryr-rs component: through kube-runtime's
//! recorder (events.k8s.io/v1, repeats of one reason folded into a series).

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType};
pub use kube::runtime::events::{Recorder, Reporter};

/// events.k8s.io caps a note at 1 kB.
const MAX_NOTE: usize = 1000;

/// Posts a Warning (or Normal) Event about `regarding`. Callers treat a failure as a courtesy
/// lost, never as the failure of what they were doing.
pub async fn publish(
    recorder: &Recorder,
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
    recorder.publish(&event, regarding).await
}
