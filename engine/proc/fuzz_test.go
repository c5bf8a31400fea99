package proc

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// Every fuzz target is seeded with the captured samples (and the files in
// testdata/fuzz/<target>/); beyond not panicking, each checks that an
// error wraps ErrMalformed or ErrTooLarge and that accepted output keeps
// the parser's invariants.

func addSamples(f *testing.F, pattern string) {
	files, err := filepath.Glob(filepath.Join("testdata", pattern))
	if err != nil || len(files) == 0 {
		f.Fatalf("no samples match %s (%v)", pattern, err)
	}
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
}

func checkParseErr(t *testing.T, err error) {
	t.Helper()
	if err != nil && !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrTooLarge) {
		t.Fatalf("error %v wraps neither ErrMalformed nor ErrTooLarge", err)
	}
}

func FuzzParseSmaps(f *testing.F) {
	addSamples(f, "*/smaps")
	addSamples(f, "*/maps")
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, smaps := range []bool{false, true} {
			ms, err := parseMaps(bytes.NewReader(b), smaps)
			checkParseErr(t, err)
			for i := range ms {
				m := &ms[i]
				if m.End < m.Start || (i > 0 && m.Start < ms[i-1].End) {
					t.Fatalf("mapping %d out of order: %v", i, m)
				}
				_ = m.Kind()
				_ = m.String()
				_ = m.Flags.String()
			}
		}
	})
}

func FuzzParseStatus(f *testing.F) {
	addSamples(f, "*/status")
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseStatus(b)
		checkParseErr(t, err)
		if err == nil && len(s.Groups) > maxGroups {
			t.Fatalf("%d groups", len(s.Groups))
		}
	})
}

func FuzzParseStat(f *testing.F) {
	addSamples(f, "*/stat")
	f.Fuzz(func(t *testing.T, b []byte) {
		_, err := ParseStat(b)
		checkParseErr(t, err)
	})
}

func FuzzParseFDInfo(f *testing.F) {
	addSamples(f, "*/fdinfo/*")
	f.Fuzz(func(t *testing.T, b []byte) {
		fi, err := ParseFDInfo(b)
		checkParseErr(t, err)
		if err == nil && len(fi.Extra)+len(fi.Locks) > maxExtraLines {
			t.Fatalf("%d extra lines", len(fi.Extra))
		}
	})
}

func FuzzParseAuxv(f *testing.F) {
	addSamples(f, "*/auxv")
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := ParseAuxv(b)
		checkParseErr(t, err)
		if err != nil {
			return
		}
		if len(a)%2 != 0 || a[len(a)-2] != AtNull || !bytes.HasPrefix(b, a.Bytes()) {
			t.Fatalf("auxv %x from %x", a, b)
		}
	})
}

func FuzzParseLimits(f *testing.F) {
	addSamples(f, "*/limits")
	f.Fuzz(func(t *testing.T, b []byte) {
		_, err := ParseLimits(b)
		checkParseErr(t, err)
	})
}

func FuzzParseMisc(f *testing.F) {
	f.Add([]byte("1 2 3\n"))
	f.Add([]byte("/bin/sleep\x001000\x00"))
	f.Add([]byte("rd wr mr mw me ac sd zz"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, err := ParseCmdline(b)
		checkParseErr(t, err)
		_, err = ParsePidList(b)
		checkParseErr(t, err)
		v, err := ParseVMFlags(string(b))
		checkParseErr(t, err)
		if err == nil {
			w, err := ParseVMFlags(v.String())
			if err != nil || w != v {
				t.Fatalf("VmFlags %q: round trip %q -> %v, %v", b, v.String(), w, err)
			}
		}
		ClassifyTarget(string(b), 0)
	})
}
