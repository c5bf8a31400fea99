// Package seal holds the cryptography of sealed and signed snapshots, in
// bytes, keys and windows: the data key and the keys derived from it
// (HKDF-SHA256), its age wrapping for recipients, the AES-256-GCM of
// blocks and of their windows, the identities a reader opens snapshots
// with (Keyring), and the ed25519 keys that sign them. It knows nothing of
// a snapshot's files: engine/image lays its bytes out and calls it (see
// engine/image's doc, "Sealed snapshots" and "Signed snapshots", for the
// layout and the reasons).
package seal
