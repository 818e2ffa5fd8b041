"""Generated protobuf and gRPC code of corral.worker.v1 (see protos/)."""
