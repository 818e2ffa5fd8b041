"""Cloud instance providers behind `services.driver.instances.InstanceProvider` (design §6).

Each cloud's provider turns its API's failures into the typed errors of `errors`, so the autoscaler
reacts to a full zone or an exhausted quota the same way whatever the cloud.
"""
