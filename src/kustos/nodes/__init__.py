"""Node image lifecycle (SPEC F-NODE-1..6): NodeImage, ScalingGroup, PendingNode and
AutoscalingStrategy keep every node on the desired image by replacing outdated ones."""
