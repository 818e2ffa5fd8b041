"""Generated protobuf and gRPC code of corral.batch.v1 (see protos/)."""
