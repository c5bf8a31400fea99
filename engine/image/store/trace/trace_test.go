package trace

import (
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

type answer struct{ status int }

func (a answer) Do(*http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: a.status}, nil
}

// TestClientLogsRequests: a line per request, with its method, path,
// range and status, appended.
func TestClientLogsRequests(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace")
	c := &Client{Next: answer{206}, Path: path}
	for _, rng := range []string{"bytes=0-1048575", ""} {
		req, _ := http.NewRequest("GET", "http://127.0.0.1:9000/snaps/a/pages-42.img", nil)
		if rng != "" {
			req.Header.Set("Range", rng)
		}
		if resp, err := c.Do(req); err != nil || resp.StatusCode != 206 {
			t.Fatalf("Do: %v %v", resp, err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := regexp.MustCompile(`^\S+Z pid \d+ GET /snaps/a/pages-42.img bytes=0-1048575 206 \S+\n\S+Z pid \d+ GET /snaps/a/pages-42.img - 206 \S+\n$`)
	if !want.Match(b) {
		t.Errorf("trace:\n%s", b)
	}
}
