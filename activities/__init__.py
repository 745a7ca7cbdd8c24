"""Model turns and tools: all I/O lives here."""

from activities.db import Database
from activities.model import ModelActivities
from activities.payments import StripeGateway
from activities.tools import ToolActivities

__all__ = ["Database", "ModelActivities", "StripeGateway", "ToolActivities"]
