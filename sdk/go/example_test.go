package corral_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	corral "github.com/corralhq/corral/sdk/go"
)

// Example creates a sandbox, runs a command with streamed output, writes and
// reads a file, and kills the sandbox. It needs a running corral server
// (CORRAL_URL, CORRAL_API_KEY or a local admin.key).
func Example() {
	ctx := context.Background()
	c, err := corral.NewFromEnv()
	if err != nil {
		log.Fatal(err)
	}
	sb, err := c.Create(ctx, corral.CreateOptions{
		Tier:      "light",
		Resources: corral.Resources{MemoryMB: 256},
		Timeout:   10 * time.Minute,
		Metadata:  map[string]string{"agent": "example"},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer sb.Kill(context.Background())

	res, err := sb.Run(ctx, "python3", corral.RunOptions{
		Args:     []string{"-c", "print(6*7)"},
		Timeout:  30 * time.Second,
		OnStdout: func(b []byte) { os.Stdout.Write(b) },
	})
	if err != nil {
		log.Fatal(err)
	}
	if res.ExitCode != 0 {
		fmt.Printf("exit %d (%s): %s", res.ExitCode, res.EndReason, res.Stderr)
	}

	if err := sb.Files().Write(ctx, "notes/hello.txt", []byte("hi\n")); err != nil {
		log.Fatal(err)
	}
	data, err := sb.Files().Read(ctx, "notes/hello.txt")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s", data)
}
