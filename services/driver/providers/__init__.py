"""The machines' providers behind one interface (`interface.py`: `InstanceProvider`, design §6): worker
processes on this host (`local.py`), Compute Engine VMs (`gcp.py`) and Azure VMs (`azure.py`).

Each cloud's provider turns its API's failures into the typed errors of `errors`, so the autoscaler
reacts to a full zone or an exhausted quota the same way whatever the cloud.
"""
