// Package image is the on-disk format of a lazyfs snapshot: a directory
// holding a manifest, process state, and per process a page index and a
// pages file.
//
//	DIR/snapshot.json      manifest, written last: a snapshot without it is
//	                       incomplete and Open refuses it (ErrIncomplete)
//	DIR/process-PID.json   process state (Process), for jq and for restore
//	DIR/pagemap-PID.img    page index: runs of dumped pages and one record
//	                       per block (binary, little-endian, below)
//	DIR/pages-PID.img      block payloads back to back
//	DIR/workingset-PID.img optional, not in the manifest: the memory a lazy
//	                       restore touched first (package workingset)
//
// # Page index (pagemap-PID.img)
//
//	offset size  field
//	     0    8  magic "LZFSPIDX"
//	     8    2  version (1)
//	    10    2  header size (64)
//	    12    4  page size (4096)
//	    16    4  block size: power of two, 4 KiB .. 4 MiB
//	    20    4  flags (0)
//	    24    8  run count R
//	    32    8  block count B
//	    40    8  size of the pages file
//	    48    4  CRC32C of the run and block tables
//	    52    8  reserved (0)
//	    60    4  CRC32C of bytes 0..59
//	    64 24*R  runs:   vaddr u64 | page count u64 | first block u64
//	     .  8*B  blocks: kind u8 | stored length u24 | CRC32C u32 of the
//	                     decoded bytes
//
// A run is a range of dumped pages inside one VMA: runs are sorted by
// address and never overlap (two runs may touch at a VMA boundary, so that
// no block crosses it). Blocks are aligned to the block
// size in the address space and clipped to their run, so the block holding
// an address is found by arithmetic, and a run of P pages at address A holds
// the blocks that cover [A, A+P*4096). A block's decoded length is therefore
// derived, never stored. Its offset in the pages file is derived too:
// payloads follow each other in block order, ZERO blocks store nothing and
// RAW payloads start on a 4 KiB boundary (the gap before them is zero
// padding), so that aligned RAW reads can use direct I/O. Each block record
// is 8 bytes.
//
// # Reading
//
// Reader gives random access by virtual address (io.ReaderAt: offset =
// address). Holes read as zeros. A read of part of a block decodes the whole
// block once into the shared cache (cache.Cache); concurrent readers of the
// same block wait for that one decode. Every block is checked against its
// CRC32C before it is cached or returned (a block of a sealed or signed
// snapshot is authenticated instead, as it is read: Reader.Authenticated);
// a mismatch is a *BlockError that names the file, the block and its
// address, and never wrong bytes.
// Uncached is the same memory for a reader that reads each block once (a
// lazy restore's pager): blocks are read straight into its buffer, through
// the same loader and checks, without the cache. Stream decodes ranges in
// bounded parallel batches (codec.DecodeBlocks) for restore and
// verification.
//
// Every length and count read from a file is bounded by the file's size and
// a hard maximum before anything is allocated.
//
// # Incremental snapshots (feature "parent", parent.go)
//
// A block record of kind codec.Parent (4) stores nothing: its bytes are
// the parent snapshot's block at the same address and of the same
// length, whose CRC32C the record repeats. The manifest's "parent" entry
// names the parent and pins it by the SHA-256 of its manifest; readers
// resolve the chain when they open a process's pages (parent.go).
//
// # Copy-on-write memory of a tree (feature "forked", forked.go)
//
// A block record of kind codec.Forked (5) stores nothing either: its bytes
// are the block at the same address and of the same length of the
// process's parent in the same snapshot (the state's ppid), whose CRC32C
// the record repeats; readers resolve it from the parent's pages, as a
// Parent block from the parent snapshot. A snapshot has one kind or the
// other, never both.
//
// # Sealed snapshots (feature "sealed", seal.go, sealpages.go; keys and
// AES-GCM in package seal)
//
//	DIR/keys.age             "LZFSKEY1" | snapshot id (16) | data key (32),
//	                         age-encrypted for each recipient
//	DIR/snapshot.auth        HMAC-SHA256 of snapshot.json (and its
//	                         signature, if signed; layout in sign.go)
//	DIR/process-PID.sealed   the state, sealed (header in seal.go)
//	DIR/pagemap-PID.sealed   the index, then 16 bytes per block: its GCM
//	                         tag (zeros for a Zero block), or per window
//	                         of a block sealed in windows, sealed together
//	DIR/pages-PID.img        the same layout as in clear, every stored
//	                         payload replaced by its AES-256-GCM ciphertext
//	                         (the same length: offsets and alignment hold)
//
// Keys are derived from the data key with HKDF-SHA256, the snapshot id as
// salt: one for the manifest's MAC, one for the sealed files (each with a
// random nonce, its clear header as associated data: role, pid, snapshot
// id), one per process for its blocks. A block's nonce is its index (each
// is sealed once under its process's key) and its associated data its
// identity: snapshot id, pid, index, address, length, kind, stored length.
// With feature "sealed-windows" (sealwindows.go, seal.Window), a Raw
// block larger than the seal's window is sealed window by window, so that
// a lazy fault reads and authenticates its window alone.
// A block's tag is kept in the index rather than after its ciphertext, so
// that the pages file keeps its layout; readers read the ciphertext into
// their buffer and decrypt it in place (Reader.Payloads). GCM has then authenticated every byte of the block
// as itself, and its CRC32C is not checked again. The index keeps the
// CRC32C of each block's plaintext: sealed with it, it leaks nothing, and
// it still checks what another party's mount serves (Reader.Checked), and
// snapctl verify checks it.
//
// Readers authenticate the manifest first (OpenOptions.Keys), then every
// file before parsing it; every failure is ErrAuth, which matches
// ErrUntrusted: the bytes are not what the dump wrote, whoever changed
// them. No identity that opens a sealed snapshot is ErrNoIdentity.
//
// # Signed snapshots (feature "signed", sign.go)
//
// The manifest is signed with ed25519 (snapshot.auth) and holds the
// SHA-256 of every file but the pages files; in clear, DIR/digests-PID.img
// holds the SHA-256 of every block's stored bytes, 32 bytes per block in
// index order (zeros for a Zero block). Sealed and signed, the blocks are
// authenticated by GCM under the data key that the signed SHA-256 of
// keys.age binds, and there is no digests file.
package image
