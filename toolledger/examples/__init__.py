"""Example toolsets shipped with toolledger (the demo's helpdesk)."""
