// Package trace logs the HTTP requests of a store that speaks HTTP (the
// S3 store, with LAZYFS_S3_TRACE=FILE): a line per request, for tests and
// for whoever wonders what a restore fetched.
package trace

import (
	"fmt"
	"net/http"
	"os"
	"time"
)

// Client passes requests to Next and appends a line per request to the
// file Path:
//
//	2026-01-02T15:04:05.000Z pid 1234 GET /bucket/prefix/pages-42.img bytes=0-1048575 206 3.2ms
//
// Each line is one write to a file opened O_APPEND, so the lines of
// several processes do not mix.
type Client struct {
	Next interface {
		Do(*http.Request) (*http.Response, error)
	}
	Path string
}

// Do runs req with Next, then logs it: method, path, range, status and
// time taken.
func (t *Client) Do(req *http.Request) (*http.Response, error) {
	start := time.Now()
	resp, err := t.Next.Do(req)
	status := "error"
	if err == nil {
		status = fmt.Sprint(resp.StatusCode)
	}
	rng := req.Header.Get("Range")
	if rng == "" {
		rng = "-"
	}
	line := fmt.Sprintf("%s pid %d %s %s %s %s %s\n", start.UTC().Format("2006-01-02T15:04:05.000Z"), os.Getpid(),
		req.Method, req.URL.EscapedPath(), rng, status, time.Since(start).Round(time.Microsecond))
	if f, ferr := os.OpenFile(t.Path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600); ferr == nil {
		f.WriteString(line)
		f.Close()
	}
	return resp, err
}
