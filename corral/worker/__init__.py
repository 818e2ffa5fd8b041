"""Generated protobuf and gRPC code of corral.worker (see protos/)."""
