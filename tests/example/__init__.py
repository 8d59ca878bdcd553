"""An example kind for tests of the CRD generator and the controller runtime."""
