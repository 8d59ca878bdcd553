"""AutoscalingStrategy: hold the cluster-autoscaler at 0 during a rollout, then give it back."""
