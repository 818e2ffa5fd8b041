"""Generated protobuf and gRPC code of corral.batch (see protos/)."""
