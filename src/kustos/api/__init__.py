"""The kustos API: one module per kind, pydantic models from which the CRDs are generated.

The package imports no kind: an operator running etcd alone builds only etcd's models (issue
28, idle RSS). ``kustos.api.resources.RESOURCES`` lists every kind that gets a CRD;
``kustos.api.refs`` every kind's REST coordinates, without its models.
"""
