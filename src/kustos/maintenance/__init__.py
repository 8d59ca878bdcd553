"""Node maintenance (SPEC F-MAINT-1..8): clear and purge dead nodes, Envoy restarts, pod image
overrides and reboot safety, under one MaintenancePolicy."""
