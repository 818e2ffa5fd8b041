"""Generated protobuf and gRPC code of corral.driver.v1 (see protos/)."""
