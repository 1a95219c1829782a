// Package corral is the Go client for corral, a sandbox runtime for AI
// agents.
//
// A [Client] talks to a corral server's REST API (create, list, inspect and
// kill sandboxes, run commands to completion with [Client.Exec]) and to each
// sandbox's agent API (streaming commands with [Sandbox.Run] and
// [Sandbox.Start], files with [Sandbox.Files]).
//
// A minimal session:
//
//	c, err := corral.NewFromEnv()
//	if err != nil { ... }
//	sb, err := c.Create(ctx, corral.CreateOptions{Tier: "light"})
//	if err != nil { ... }
//	defer sb.Kill(context.Background())
//	res, err := sb.Run(ctx, "echo hello", corral.RunOptions{})
//	fmt.Print(res.Stdout)
//
// Errors returned by the server are [*APIError] values; use helpers such as
// [IsNotFound] or errors.Is with sentinels such as [ErrNotFound] to test
// them. A command that exits with a non-zero code is not an error: the
// [CommandResult] carries the exit code.
package corral
