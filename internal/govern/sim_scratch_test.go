package govern
import ("fmt";"testing")
func TestSimScratch(t *testing.T) {
	a := "curl -s 'https://api.search.example/q?query=asyncio+timeout&page=1'"
	for _, b := range []string{"curl -s 'https://api.search.example/q?query=asyncio+timeout+error+handling&page=1'", "curl -s 'https://api.search.example/q?query=asyncio+timeout+error+handling+python&page=1'", "curl -s 'https://api.search.example/q?query=asyncio+timeout+error&page=1'", "curl -s 'https://api.search.example/q?query=asyncio+timeout+error+handler&page=1'"} {
		fmt.Printf("%.3f %s\n", Similarity(a,b), b)
	}
	fmt.Printf("%.3f\n", Similarity("curl -s 'https://api.search.example/q?query=asyncio+timeout+error&page=1'", "curl -s 'https://api.search.example/q?query=asyncio+timeout+error+handling+python&page=1'"))
}
