module github.com/lazyfs/lazyfs

go 1.26.8

require (
	github.com/pierrec/lz4/v4 v4.1.33
	golang.org/x/sys v0.50.0
)
