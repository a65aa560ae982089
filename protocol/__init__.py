"""The queue protocol (docs/protocol.md): wire models and error codes.

The worker and the reference scheduler both speak it, and neither imports the other. It depends on
pydantic alone, so another scheduler or a client can reuse it as the schema.
"""

from protocol.errors import CANCELLED_MARK, ErrorCode, was_cancelled
from protocol.models import (
    AdapterSetKey,
    AdapterUsed,
    BIDI_CONTROLS,
    FINAL_STATUSES,
    DeviceInfo,
    ErrorEnvelope,
    Heartbeat,
    HeartbeatReply,
    ImageResult,
    Lease,
    LeaseRequest,
    LeaseResponse,
    MAX_ADAPTER_SETS,
    ModelFigures,
    ModelId,
    ModelsView,
    QueueFigures,
    Registered,
    RegistrationStatus,
    RegisterWorker,
    Exchange,
    Exchanged,
    Report,
    ReportBatch,
    ReportOutcome,
    ReportOutcomes,
    ReportStatus,
    SubmitBatch,
    SubmitTask,
    SubmittedBatch,
    TaskList,
    TaskReport,
    TaskResult,
    TaskStatus,
    TaskView,
    Webhook,
    WebhookAttempt,
    WorkerLimits,
    WorkerModels,
    WorkerStatus,
    WorkerView,
    adapter_set_key,
    bidi_control,
    parse_body,
    stored,
)

__all__ = ["AdapterSetKey", "AdapterUsed", "adapter_set_key", "parse_body", "stored", "CANCELLED_MARK", "was_cancelled", "FINAL_STATUSES", "DeviceInfo", "ErrorCode", "ErrorEnvelope", "Heartbeat", "HeartbeatReply", "Lease", "LeaseRequest",
           "LeaseResponse", "MAX_ADAPTER_SETS", "ModelFigures", "ModelId", "ModelsView", "QueueFigures", "Registered", "RegistrationStatus", "RegisterWorker", "Exchange", "Exchanged", "Report", "ReportBatch", "ReportOutcome", "ReportOutcomes", "ReportStatus", "SubmitBatch", "SubmitTask", "SubmittedBatch", "TaskList",
           "ImageResult", "TaskReport", "TaskResult", "TaskStatus", "TaskView", "Webhook", "WebhookAttempt", "WorkerLimits", "WorkerModels", "WorkerStatus", "WorkerView",
           "BIDI_CONTROLS", "bidi_control"]
