package s3

import (
	"context"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/lazyfs/lazyfs/engine/image/store"
)

// LockName is the object a dump holds while it writes a prefix (and a
// dump that died leaves: snapctl cleanup clears it).
const LockName = lockName

// Prefix is what an address holds, as snapctl ls and rm see it: the
// objects right under it, and the prefixes right below it.
type Prefix struct {
	Addr Address
	// Objects are the objects right under the prefix: name to size.
	Objects map[string]int64
	// Children are the addresses of the prefixes right below it
	// (s3://BUCKET/PREFIX/NAME), sorted.
	Children []string
	c        *client
}

// ListPrefix lists addr: one listing of its objects and of the prefixes
// below it.
func ListPrefix(ctx context.Context, addr string, o store.Options) (*Prefix, error) {
	a, err := ParseAddress(addr)
	if err != nil {
		return nil, err
	}
	c, err := newClient(ctx, a, o)
	if err != nil {
		return nil, err
	}
	p := &Prefix{Addr: a, Objects: map[string]int64{}, c: c}
	in := &s3.ListObjectsV2Input{Bucket: aws.String(a.Bucket), Prefix: aws.String(a.listPrefix()), Delimiter: aws.String("/")}
	pages := s3.NewListObjectsV2Paginator(c.s3, in)
	for pages.HasMorePages() {
		octx, cancel := context.WithTimeout(ctx, opTimeout)
		page, err := pages.NextPage(octx)
		cancel()
		if err != nil {
			return nil, c.storeError("list objects", err)
		}
		for _, ob := range page.Contents {
			p.Objects[strings.TrimPrefix(aws.ToString(ob.Key), a.listPrefix())] = aws.ToInt64(ob.Size)
		}
		for _, cp := range page.CommonPrefixes {
			name := strings.TrimSuffix(strings.TrimPrefix(aws.ToString(cp.Prefix), a.listPrefix()), "/")
			if name == "" || name == "." || name == ".." {
				continue // not an address ParseAddress would take
			}
			p.Children = append(p.Children, Address{Bucket: a.Bucket, Prefix: a.key(name)}.String())
		}
	}
	return p, nil
}

// Remove deletes the named objects of the prefix, in the order given,
// and stops at the first that fails.
func (p *Prefix) Remove(ctx context.Context, names []string) error {
	for _, name := range names {
		if err := p.c.remove(ctx, name); err != nil {
			return err
		}
		delete(p.Objects, name)
	}
	return nil
}
