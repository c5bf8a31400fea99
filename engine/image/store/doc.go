// Package store holds the files of snapshots: the Store a reader of the
// format opens files from, the StoreWriter a dump uploads them to, the
// directory store (a snapshot directory, the default) and the registry of
// the other kinds: an address scheme per object store (RegisterScheme,
// "s3" for s3://BUCKET/PREFIX) and the store of a snapshot held in one
// file (RegisterFileStore, an archive). Open picks the store of a
// directory, an address or an archive file.
//
// The package knows nothing of the format: the checks of the format (the
// manifest's sizes and CRC32C, every block's CRC32C) are engine/image's,
// the same whatever holds the bytes. Its subpackages are the stores
// themselves (s3, archive), the disk cache of fetched chunks any store
// may keep (cache), the log of the requests of a store that speaks HTTP
// (trace), and the conformance suite every store passes (storetest).
package store
