from pipe.launch import main

main()
