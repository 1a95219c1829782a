package bench

import (
	"context"
	"testing"

	corral "github.com/corralhq/corral/sdk/go"
)

// BenchmarkColdPaired measures corral's create → first exec, raw `runc
// run` of the same rootfs (the issue's baseline: the smallest spec that
// runs it, minimalSpec, without seccomp), raw `runc run` of it with
// corral's own spec (the same seccomp filter, capabilities, cgroup
// limits, masks and mounts: what corral adds over the runtime with the
// same security settings) and `docker run --rm` of it (when Docker can
// run here) in turn within each iteration, so that all see the same load
// of the host: on a shared machine whose load changes from minute to
// minute, the ratios of this benchmark are the fair ones (the separate
// benchmarks run minutes apart). It reports PairedCorral, PairedRunc,
// PairedRuncCorralSpec and PairedDocker.
func BenchmarkColdPaired(b *testing.B) {
	c := client(b)
	r := newRawRunc(b)
	bundle := r.bundle(b, "paired-true", minimalSpec(r, "/bin/true"))
	corralBundle := r.bundle(b, "paired-corral-true", r.corralSpec(b, "/bin/true"))
	var d *dockerd
	docker.once.Do(func() { docker.d, docker.err = launchDocker() })
	if docker.err == nil {
		d = docker.d
	} else {
		b.Logf("without Docker: %v", docker.err)
	}
	ctx := context.Background()
	sc, sr, ss, sd := newSamples(b), newSamples(b), newSamples(b), newSamples(b)
	for i := 0; i < b.N; i++ {
		sc.start()
		sb, err := c.Create(ctx, corral.CreateOptions{})
		if err != nil {
			b.Fatalf("create: %v", err)
		}
		res, err := sb.Run(ctx, "true", trueArgv)
		sc.stop()
		kerr := sb.Kill(ctx)
		checkTrue(b, res, err)
		if kerr != nil {
			b.Fatalf("kill: %v", kerr)
		}
		timeCmd(b, sr, r.runCmd(bundle))
		timeCmd(b, ss, r.runCmd(corralBundle))
		if d != nil {
			timeCmd(b, sd, d.runCmd())
		}
	}
	sc.reportAs("PairedCorral")
	sr.reportAs("PairedRunc")
	ss.reportAs("PairedRuncCorralSpec")
	sd.reportAs("PairedDocker")
}
