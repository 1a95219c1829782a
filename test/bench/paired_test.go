package bench

import (
	"bytes"
	"context"
	"io"
	"testing"
	"time"

	corral "github.com/corralhq/corral/sdk/go"
)

// BenchmarkColdPaired measures corral's create → first exec, raw `runc
// run` of the same rootfs and `docker run --rm` of it (when Docker can
// run here) in turn within each iteration, so that the three see the same
// load of the host: on a shared machine whose load changes from minute to
// minute, the ratios of this benchmark are the fair ones (the separate
// benchmarks run minutes apart). It reports PairedCorral, PairedRunc and
// PairedDocker.
func BenchmarkColdPaired(b *testing.B) {
	c := client(b)
	r := newRawRunc(b)
	bundle := r.bundle(b, "paired-true", minimalSpec(r, "/bin/true"))
	var d *dockerd
	docker.once.Do(func() { docker.d, docker.err = launchDocker() })
	if docker.err == nil {
		d = docker.d
	} else {
		b.Logf("without Docker: %v", docker.err)
	}
	ctx := context.Background()
	sc, sr, sd := newSamples(b), newSamples(b), newSamples(b)
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		sb, err := c.Create(ctx, corral.CreateOptions{})
		if err != nil {
			b.Fatalf("create: %v", err)
		}
		res, err := sb.Run(ctx, "true", trueArgv)
		sc.add(time.Since(t0))
		kerr := sb.Kill(ctx)
		checkTrue(b, res, err)
		if kerr != nil {
			b.Fatalf("kill: %v", kerr)
		}
		cmd := r.cmd("run", "--bundle", bundle, r.newID())
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = io.Discard, &stderr
		t0 = time.Now()
		err = cmd.Run()
		sr.add(time.Since(t0))
		if err != nil {
			b.Fatalf("runc run: %v: %s", err, stderr.Bytes())
		}
		if d != nil {
			cmd := d.cmd("run", "--rm", "--network", "none", dockerImage, "/bin/true")
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			t0 = time.Now()
			err := cmd.Run()
			sd.add(time.Since(t0))
			if err != nil {
				b.Fatalf("docker run: %v: %s", err, out.Bytes())
			}
		}
	}
	sc.reportAs("PairedCorral")
	sr.reportAs("PairedRunc")
	sd.reportAs("PairedDocker")
}
