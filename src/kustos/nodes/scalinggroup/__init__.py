"""ScalingGroup: keep a provider group's image for new instances on its NodeImage's image."""
