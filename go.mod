module github.com/lazyfs/lazyfs

go 1.26.8

require (
	filippo.io/age v1.3.2
	github.com/hanwen/go-fuse/v2 v2.12.1
	github.com/hashicorp/golang-lru/v2 v2.0.7
	github.com/pierrec/lz4/v4 v4.1.33
	golang.org/x/crypto v0.55.0
	golang.org/x/sync v0.25.0
	golang.org/x/sys v0.50.0
)

require github.com/klauspost/compress v1.20.4

require filippo.io/hpke v0.4.0 // indirect
