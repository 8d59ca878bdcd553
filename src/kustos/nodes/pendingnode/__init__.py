"""PendingNode: instances joining or leaving, with deadlines that never hold a rollout forever."""
