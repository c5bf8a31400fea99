package measure

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

const S3Bucket = "bench"

// minioServer is the bench's MinIO.
type minioServer struct {
	cmd      *exec.Cmd
	done     chan struct{}
	endpoint string
}

func StartMinIO(ctx context.Context, dir, logPath string) (*minioServer, error) {
	bin, err := exec.LookPath("minio")
	if err != nil {
		return nil, fmt.Errorf("minio (installed by .ci/setup): %w", err)
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	console, err := FreePort()
	if err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	m := &minioServer{endpoint: fmt.Sprintf("http://127.0.0.1:%d", port), done: make(chan struct{})}
	m.cmd = exec.Command(bin, "server", "--quiet", "--address", "127.0.0.1:"+strconv.Itoa(port), "--console-address", "127.0.0.1:"+strconv.Itoa(console), filepath.Join(dir, "data"))
	m.cmd.Env = append(os.Environ(), "MINIO_ROOT_USER=lazyfs-bench", "MINIO_ROOT_PASSWORD=lazyfs-bench-secret", "MINIO_BROWSER=off", "MINIO_UPDATE=off", "HOME="+dir)
	m.cmd.Stdout, m.cmd.Stderr = logf, logf
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := m.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { m.cmd.Wait(); close(m.done) }()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		select {
		case <-m.done:
			return nil, errors.New("minio exited at start (see its log)")
		default:
		}
		resp, err := http.Get(m.endpoint + "/minio/health/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				c := s3.New(s3.Options{Region: "us-east-1", BaseEndpoint: aws.String(m.endpoint), UsePathStyle: true,
					Credentials: credentials.NewStaticCredentialsProvider("lazyfs-bench", "lazyfs-bench-secret", "")})
				// Ready may still mean XMinioServerNotInitialized.
				if _, err := c.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(S3Bucket)}); err == nil {
					return m, nil
				} else if !strings.Contains(err.Error(), "NotInitialized") {
					m.Stop()
					return nil, fmt.Errorf("create bucket: %w", err)
				}
			}
		}
	}
	m.Stop()
	return nil, errors.New("minio not ready after 30s")
}

func (m *minioServer) Stop() {
	syscall.Kill(-m.cmd.Process.Pid, syscall.SIGKILL)
	<-m.done
}

// S3Env points the AWS variables of this process, and so of the snapctl
// it starts, at m; it returns what undoes it.
func S3Env(m *minioServer) func() {
	vars := map[string]string{"AWS_ACCESS_KEY_ID": "lazyfs-bench", "AWS_SECRET_ACCESS_KEY": "lazyfs-bench-secret", "AWS_REGION": "us-east-1",
		"AWS_ENDPOINT_URL": m.endpoint, "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null", "AWS_EC2_METADATA_DISABLED": "true"}
	old := map[string]*string{}
	for k, v := range vars {
		if o, ok := os.LookupEnv(k); ok {
			old[k] = &o
		} else {
			old[k] = nil
		}
		os.Setenv(k, v)
	}
	return func() {
		for k, v := range old {
			if v == nil {
				os.Unsetenv(k)
			} else {
				os.Setenv(k, *v)
			}
		}
	}
}
