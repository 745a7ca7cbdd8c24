"""Everything the agent workflow takes from outside its sandbox, in one module.

The sandbox imports the workflow's module afresh for every run, and passes each module that module
imports through from the worker's own, one by one (about 30 microseconds a module, its parent
package included): seventeen of them were a seventh of a run's import. The workflow imports this one
instead. What is here is deterministic and keeps no state a run could change: types, pure functions,
the activities' definitions (referred to by name, never called in the workflow) and constants.
"""

from activities.asking import AskingActivities
from activities.authority import AuthorityActivities
from activities.model import ModelActivities
from activities.operations import OperationsActivities
from activities.tools import ToolActivities
from core import names, policies
from core.authority import DECISIONS_KEPT, Waiter, narrow, out_of_scope, read_decision, screen, signature_holds
from core.bounds import MAX_WINDOW_BYTES, bounded_reply
from core.failures import Decided, Unusable, Waiting
from core.gate import GateCall, Refused, Rejection, validate_call
from core.keys import call_signature, derive_intent_key
from core.models import (
    SETTLED,
    AlertInput,
    AlertKind,
    Approval,
    AskAnswer,
    AskInput,
    Carry,
    ChatMessage,
    Checkpoint,
    DeadLetterInput,
    Decision,
    DecisionReceipt,
    DecisionRecord,
    DecisionStatus,
    DecisionVia,
    Escalation,
    EscalationReason,
    InspectInput,
    IntentView,
    ModelReply,
    ModelTurnInput,
    Outcome,
    Policy,
    PolicyInput,
    ResolveInput,
    SettleInput,
    Step,
    TaskInput,
    TaskResult,
    TaskState,
    ToolCall,
    ToolInput,
    ToolResult,
    Verdict,
    VerifyInput,
)
from core.tools import ToolSpec
from workflows._question import Question
from workflows._render import JOURNAL_NOTE, activity_summary, current_details, trail_line

__all__ = [
    "DECISIONS_KEPT", "JOURNAL_NOTE", "MAX_WINDOW_BYTES", "SETTLED", "AlertInput", "AlertKind", "Approval",
    "AskAnswer", "AskInput", "AskingActivities", "AuthorityActivities", "Carry", "ChatMessage", "Checkpoint",
    "DeadLetterInput", "Decided", "Decision", "DecisionReceipt", "DecisionRecord", "DecisionStatus", "DecisionVia",
    "Escalation", "EscalationReason", "GateCall", "InspectInput", "IntentView", "ModelActivities", "ModelReply",
    "ModelTurnInput", "OperationsActivities", "Outcome", "Policy", "PolicyInput", "Question", "Refused",
    "Rejection", "ResolveInput", "SettleInput", "Step", "TaskInput", "TaskResult", "TaskState", "ToolActivities",
    "ToolCall", "ToolInput", "ToolResult", "ToolSpec", "Unusable", "Verdict", "VerifyInput", "Waiter", "Waiting",
    "activity_summary", "bounded_reply", "call_signature", "current_details", "derive_intent_key", "names",
    "narrow", "out_of_scope", "policies", "read_decision", "screen", "signature_holds", "trail_line",
    "validate_call",
]
