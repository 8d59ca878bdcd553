"""Cloud providers behind ``runtime.cloud.CloudProvider``: kwok (dev cluster, tests) and AWS."""
